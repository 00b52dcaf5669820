"""How every comparison runs: its phases over (seed, arm, λ) jobs (``phases``), the
``transformers.Trainer`` that trains every arm (``trainer``), what training logs
(``training_log``), the examples' batches (``batches``), what is read of a trained arm besides
``numtok.predict_numbers`` (``scoring``), jobs in worker processes (``parallel``) and the run
folder's layout (``run_folder``)."""
