"""Inputs: the model (`ModelSpec`), the devices (`Inventory`, device catalog). Imports nothing else of ours."""
