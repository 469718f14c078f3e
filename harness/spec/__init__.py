"""The suite model: suite files parsed into frozen spec types (`suite`), the errors that
name a field (`errors`), and the built-in suites (`builtin`, `suites/*.toml`)."""
