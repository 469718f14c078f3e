"""`hetbench advise`: a recorded job's fit (`advice_fit`), its remedies predicted, ranked
and explained (`advisor`), and what it writes (`advice_report`)."""
