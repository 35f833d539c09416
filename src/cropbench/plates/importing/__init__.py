"""``cropbench import``: a CellProfiler / CytoTable single-cell table plus its TIFF fields → a plate.

The table (Parquet or CSV, one row per cell) says where each cell is (plate, well, site), where
its centroid and bounding box are (in a chosen compartment), and which file holds each channel of
its field. The naming variants these tools produce are resolved here:

- plate / well / site as ``Metadata_*`` or ``Image_Metadata_*``, each optionally with a merge
  suffix (``_x``, ``_y``) left by joining image and object tables; a well as ``B7``/``B07`` or as
  row + column columns;
- files as ``Image_FileName_<Channel>`` or ``Image_FileName_Orig<Channel>`` (also without the
  ``Image_`` prefix), with optional ``Image_PathName_*`` folders, resolved against the image
  folder when the recorded folder does not exist here or lies outside it; every file must resolve
  (links followed) to a place under the image folder, else the row naming it is an error;
- without file name columns, Phenix-style names in the image folder
  (``r01c01f01p01-ch2sk1fk1fl1.tiff``: row, column, field, plane, channel; channels ``ch1``…);
- centroids ``<Compartment>_Location_Center_X/Y`` and boxes
  ``<Compartment>_AreaShape_BoundingBoxMinimum/Maximum_X/Y`` (CellProfiler maxima are exclusive).

The object table keeps each cell's identity in the source: ``object_id`` and ``source_row`` (its
row number in the source table), ``source_site`` (the site number the source gives, while ``field``
is the plate's 0-based field index within the well) and CellProfiler's ``ImageNumber`` /
``ObjectNumber`` where the table has them; ``--label COLUMN`` carries further columns (perturbation,
control type, dose) for training, string ones with their class list beside the plate.

The physical pixel size comes from ``Image_Metadata_ImageResolutionX/Y`` when the table records it
(else ``--pixel-size``) and is written into the NGFF ``coordinateTransformations``.

Everything is checked before anything is written, the headers of every TIFF included (a file cut
short, not a TIFF, of another shape or dtype); bad input raises :class:`ImportInputError` naming the
file. A file that only fails while its pixels are decoded stops the import with nothing left behind.

One module per job: ``columns`` reads the table and finds each column under its many names,
``files`` finds, checks and reads the image files, and ``plan`` resolves the import plan and writes
the plate.
"""

from __future__ import annotations

from cropbench.plates.importing.columns import (
    COMPARTMENTS,
    IDENTITY_COLUMNS,
    MERGE_SUFFIXES,
    read_table,
)
from cropbench.plates.importing.files import DTYPES, IMAGE_SUFFIXES, FieldSource
from cropbench.plates.importing.plan import ImportOptions, ImportPlan, import_plate, plan_import

__all__ = [
    "COMPARTMENTS",
    "DTYPES",
    "IDENTITY_COLUMNS",
    "IMAGE_SUFFIXES",
    "MERGE_SUFFIXES",
    "FieldSource",
    "ImportOptions",
    "ImportPlan",
    "import_plate",
    "plan_import",
    "read_table",
]
