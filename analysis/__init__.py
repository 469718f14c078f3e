"""Pure analysis functions: DataFrame in, DataFrame out. Plotting lives only in figures."""
