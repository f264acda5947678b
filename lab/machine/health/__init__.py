"""Cluster acceptance: is this host, and this fabric, fit to train on? `lab doctor` asks the host (one line a
check), `lab validate` judges a fabric's recorded facts and all-reduce results against its platform's floors. It
measures nothing itself (the benchmarks do, and scripts/node-facts.sh gathers the facts); it judges, in one
vocabulary of verdicts (lab.verdict)."""
