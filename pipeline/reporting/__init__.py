"""What the report shows: the papers' claims, the minimum-width tables, the figures, the page."""
