"""Who computes what, as pure decisions (no communication): batch-slice policies, the
adaptive repartitioner and their solvers (`policies`), per-layer profiles
(`layerprofile`), the stage split (`stages`) and virtual workers (`virtual`)."""
