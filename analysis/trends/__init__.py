"""A run's steps over time: autocorrelation and change points (`persistence`), fail-slow
detection (`failslow`), and the detector checked against the emulated schedules
(`failslow_check`)."""
