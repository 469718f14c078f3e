"""Running suites on this host: the launcher (`launcher`), the processes beside the
workers (`services`), and the framework probe (`probe`)."""
