"""What every track runs on and shares: the run's plate (:mod:`~cropbench.harness.context`), the one loop
(:mod:`~cropbench.harness.runner`), validity flags, work folders, paired ratios, the crop windows, the one in-memory
reference, the Dataset and DataLoader measurements several tracks are built from, and the crop path the asv suites
measure (:mod:`~cropbench.harness.crop_path`). Nothing here imports a track."""
