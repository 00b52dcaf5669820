"""How every comparison runs: its phases over (seed, arm, λ) jobs (``phases``), the training loop
they share (``loop``), jobs in worker processes (``parallel``) and the run folder's layout
(``run_folder``)."""
