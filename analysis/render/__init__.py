"""What people read, drawn from the tables the rooms below work out: report.md
(`report`), the terminal summary (`terminal`), report.html (`html_report`), the paper's
table (`paper`), and every figure (`figures`: the one module that plots)."""
