"""How every comparison runs: its phases over (seed, arm, λ) jobs (``phases``), the
``transformers.Trainer`` that trains the fine-tuning arms (``trainer``) and the loop that still
trains the from-scratch ones (``loop``), what training logs (``training_log``), jobs in worker
processes (``parallel``) and the run folder's layout (``run_folder``)."""
