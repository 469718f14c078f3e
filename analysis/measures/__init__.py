"""One run's measures: the per-worker cost model (`costmodel`) and what-if scenarios
(`whatif`), who straggled and why (`stragglers`), each worker's exchange against its link
(`network`) and bytes per parameter server (`traffic`), the worker-by-step heatmap
(`heatmap`), a few steps up close (`timeline`), pipeline stages and bubbles (`pipeline`)."""
