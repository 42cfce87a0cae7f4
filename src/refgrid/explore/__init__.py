"""What notebooks use to explore an archive: the chunk-shape advisor (advise) and matplotlib
pictures (plot, the ``plot`` extra). Reprs live with the model (:mod:`refgrid.core.reprs`) and
the chunk picture with the grid (:mod:`refgrid.grid.svg`)."""
