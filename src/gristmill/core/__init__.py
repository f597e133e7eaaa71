"""The core every layer above builds on: the step contract, the stage context that global steps
plan against, document I/O between stages, drop/score sinks, and the config library.

Nothing here imports a step, the planner or the trainer (see docs/architecture.md, "Layers").
"""
