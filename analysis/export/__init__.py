"""Runs in other tools' formats (`hetbench export`): TensorBoard's event files
(`to_tensorboard`) and MLPerf's `:::MLLOG` logs (`to_mlperf`)."""
