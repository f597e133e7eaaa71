"""Planning a run into executor stages; readers, writers, the run directory and stats."""
