"""Plans: the on-disk format (Plan, Mesh), the 1F1B simulator, the exact layer split and the search."""
