"""What a run leaves behind: the record schema and part files (`collector`), the run
directory (`rundir`) and its manifest (`manifest`), reading runs back (`results`), and the
committed baselines over git history (`baselines`)."""
