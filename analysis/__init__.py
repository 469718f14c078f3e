"""Analysis of recorded runs: DataFrames in, DataFrames out; it never runs anything.

Its rooms, from the top (each imports only the rooms below it: pyproject's
`analysis-rooms` contract): `advice`; `render` | `export`; `tables` | `models`; `trends`;
`measures`; `view`. Plotting lives only in `render.figures`."""
