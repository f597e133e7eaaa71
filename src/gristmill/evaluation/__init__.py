"""`pipeline eval`: a model (training output, checkpoint or exported HF directory) scored on
in-context tasks (multiple choice, schema, language modelling) and on held-out text (bits per
byte), with per-item results and bootstrap intervals. Scoring follows lm-evaluation-harness's
definitions item by item (docs/evaluation.md)."""
