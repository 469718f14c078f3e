"""The host and the process: CPU time (`cputime`), /proc (`procfs`), clock domains and
offsets (`clocks`), the host sampler (`sampler`), the environment (`environment`), network
namespaces (`netns`), signals (`signals`) and exits without teardown (`exits`)."""
