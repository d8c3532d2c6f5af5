"""The registered experiments, one module each (``python -m lpfail list`` shows them): `symptom` (chapter 1's
search, with the generic subprocess sweep driver in `driver`), `rounding` (chapter 4), `fix_rows` (the fix at
large tied logits), `train_ddp` and `train_speed` (appendix A). The core library (`lpfail.train`,
`lpfail.model`, ...) never imports this package; `lpfail.results.registry()` imports its modules on first use."""
