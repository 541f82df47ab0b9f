"""jaxsearch.scoring: answer metrics (EM/F1), rewards, judges and held-out metrics: what RL and evaluation both use."""
