"""Document filters: language ID and heuristic (Gopher, C4) quality filters."""
