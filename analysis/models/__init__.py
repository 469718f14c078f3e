"""Runs not recorded, predicted: device classes fitted from recorded runs or named
profiles (`deviceclass`, profiles/*.json), the scale-out simulator (`simulate`) and its
schemes in a real run's terms (`simulated`), a pipelined remedy (`pipeline_model`) run op
by op on shared cores (`stage_sharing`), workers sharing a host's cores (`contention`)."""
