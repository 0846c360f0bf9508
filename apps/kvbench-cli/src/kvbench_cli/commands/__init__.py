"""One module per command group; each registers its commands on the top-level parser (``register``)."""
