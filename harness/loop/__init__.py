"""The step engine: the data-parallel worker (`worker`), pipeline stages (`stage`), the
coordinator of tensorflow-ps (`tensorflow_coordinator`), the phase timer (`timer`), and
what happens between steps (`repartitioning`, `membership`)."""
