"""Validation against real runs: blind predictions (:mod:`.blind`) and their scores (:mod:`.score`)."""
