"""Tables over the runs of suites: the metric registry (`registry`), one row per run and
groups over repeats (`runs`), schemes and staleness (`schemes`), time to target
(`convergence`), steps to target against BSP's (`statistical`), partition history
(`repartition`), BASE vs CURRENT verdicts (`compare`)."""
