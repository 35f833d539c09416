/* The direct reader's assembly step in C: copy every (crop, chunk) piece of a batch from its
 * decoded chunk into the output, with the GIL released for all the copies of a call.
 *
 * The Python loop this replaces (cropbench.formats.chunks._copy_pieces_python) spends a few
 * microseconds of interpreter time per piece around a copy of a few kilobytes, and hands the GIL
 * over twice per piece; with several decode threads that hand-over, not the copying, set the
 * pace. Here the pieces are read and checked with the GIL held, then copied row by row with
 * memcpy without it. Anything this code does not handle (a dtype change, rows that are not
 * contiguous, channel indices that are not int64) raises TypeError, and the caller copies
 * those pieces in Python; a piece outside its chunk or its slot raises ValueError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    const char *source;        /* the piece's first row in channel 0 of the chunk's selection */
    char *target;              /* the piece's first row in the output */
    Py_ssize_t rows;           /* rows of the piece */
    Py_ssize_t row_bytes;      /* bytes per row */
    Py_ssize_t channels;       /* channels copied */
    const int64_t *positions;  /* output channel of each copied channel, or NULL for 0..channels-1 */
    const int64_t *offsets;    /* chunk channel of each copied channel, or NULL for 0..channels-1 */
    Py_ssize_t source_channel_stride, source_row_stride;
    Py_ssize_t target_channel_stride, target_row_stride;
} Copy;

static int same_format(const char *a, const char *b) {
    /* '=H' and 'H' and '<H' describe the same native uint16; compare the type letter only */
    while (*a == '=' || *a == '<' || *a == '@') a++;
    while (*b == '=' || *b == '<' || *b == '@') b++;
    return strcmp(a, b) == 0;
}

/* The channel selection of a piece: slice(None) (all channels) or a 1-D int64 array. */
static int channel_indices(PyObject *selection, Py_buffer *view, const int64_t **indices,
                           Py_ssize_t *count, Py_ssize_t limit) {
    if (PySlice_Check(selection)) {
        PySliceObject *slice = (PySliceObject *)selection;
        if (slice->start != Py_None || slice->stop != Py_None || slice->step != Py_None) {
            PyErr_SetString(PyExc_TypeError, "only slice(None) channel selections are copied in C");
            return -1;
        }
        *indices = NULL;
        *count = -1; /* all */
        return 0;
    }
    if (PyObject_GetBuffer(selection, view, PyBUF_FORMAT | PyBUF_ND) < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "channel selection is not an array");
        return -1;
    }
    if (view->ndim != 1 || view->itemsize != 8 || !(same_format(view->format, "q") || same_format(view->format, "l"))) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_TypeError, "channel selection is not a 1-D int64 array");
        return -1;
    }
    *indices = (const int64_t *)view->buf;
    *count = view->shape[0];
    for (Py_ssize_t i = 0; i < *count; i++) {
        if ((*indices)[i] < 0 || (*indices)[i] >= limit) {
            PyBuffer_Release(view);
            PyErr_SetString(PyExc_ValueError, "channel index outside the chunk or the output");
            return -1;
        }
    }
    return 0;
}

static int as_index(PyObject *item, Py_ssize_t *value) {
    *value = PyLong_AsSsize_t(item);
    return (*value == -1 && PyErr_Occurred()) ? -1 : 0;
}

static PyObject *copy_pieces(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *pieces, *chunks, *out_object;
    if (!PyArg_ParseTuple(args, "O!O!O", &PyList_Type, &pieces, &PyDict_Type, &chunks, &out_object)) return NULL;
    Py_buffer out;
    if (PyObject_GetBuffer(out_object, &out, PyBUF_RECORDS) < 0) return NULL;
    Py_ssize_t count = PyList_GET_SIZE(pieces);
    Copy *copies = PyMem_Calloc(count ? count : 1, sizeof(Copy));
    /* every buffer taken: chunks and channel selections, released once the copies are done */
    Py_buffer *views = PyMem_Calloc(count ? 3 * count : 1, sizeof(Py_buffer));
    Py_ssize_t held = 0;
    PyObject *result = NULL;
    if (copies == NULL || views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (out.ndim != 4 || out.strides[3] != out.itemsize) {
        PyErr_SetString(PyExc_TypeError, "output is not a (B, C, H, W) array with contiguous rows");
        goto done;
    }
    for (Py_ssize_t p = 0; p < count; p++) {
        PyObject *piece = PyList_GET_ITEM(pieces, p);
        if (!PyTuple_Check(piece) || PyTuple_GET_SIZE(piece) != 12) {
            PyErr_SetString(PyExc_TypeError, "a piece is not a 12-tuple");
            goto done;
        }
        Py_ssize_t at[12];
        for (int i = 4; i < 12; i++)
            if (as_index(PyTuple_GET_ITEM(piece, i), &at[i]) < 0) goto done;
        if (as_index(PyTuple_GET_ITEM(piece, 1), &at[1]) < 0) goto done;
        PyObject *chunk = PyDict_GetItemWithError(chunks, PyTuple_GET_ITEM(piece, 0));
        if (chunk == NULL) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_KeyError, "a piece's chunk is not among the chunks given");
            goto done;
        }
        Py_buffer *source = &views[held];
        if (PyObject_GetBuffer(chunk, source, PyBUF_RECORDS_RO) < 0) goto done;
        held++;
        if (source->ndim != 3 || source->strides[2] != source->itemsize || source->itemsize != out.itemsize ||
            !same_format(source->format, out.format)) {
            PyErr_SetString(PyExc_TypeError, "a chunk is not a (C, H, W) array of the output's type with contiguous rows");
            goto done;
        }
        Py_ssize_t slot = at[1], sy0 = at[4], sy1 = at[5], sx0 = at[6], sx1 = at[7];
        Py_ssize_t dy0 = at[8], dy1 = at[9], dx0 = at[10], dx1 = at[11];
        if (slot < 0 || slot >= out.shape[0] || sy0 < 0 || sy1 > source->shape[1] || sy0 > sy1 || sx0 < 0 ||
            sx1 > source->shape[2] || sx0 > sx1 || dy0 < 0 || dy1 > out.shape[2] || dx0 < 0 ||
            dx1 > out.shape[3] || dy1 - dy0 != sy1 - sy0 || dx1 - dx0 != sx1 - sx0) {
            PyErr_Format(PyExc_ValueError, "piece %zd lies outside its chunk or its output slot", p);
            goto done;
        }
        Copy *copy = &copies[p];
        Py_ssize_t positions_count, offsets_count;
        if (channel_indices(PyTuple_GET_ITEM(piece, 2), &views[held], &copy->positions, &positions_count,
                            out.shape[1]) < 0)
            goto done;
        if (copy->positions != NULL) held++;
        if (channel_indices(PyTuple_GET_ITEM(piece, 3), &views[held], &copy->offsets, &offsets_count,
                            source->shape[0]) < 0)
            goto done;
        if (copy->offsets != NULL) held++;
        Py_ssize_t channels = positions_count >= 0 ? positions_count : offsets_count >= 0 ? offsets_count : out.shape[1];
        if ((positions_count >= 0 && positions_count != channels) || (offsets_count >= 0 && offsets_count != channels) ||
            (positions_count < 0 && channels > out.shape[1]) || (offsets_count < 0 && channels > source->shape[0]) ||
            (positions_count < 0 && offsets_count < 0 && source->shape[0] != out.shape[1])) {
            PyErr_Format(PyExc_ValueError, "piece %zd selects different channel counts in its chunk and the output", p);
            goto done;
        }
        copy->channels = channels;
        copy->rows = sy1 - sy0;
        copy->row_bytes = (sx1 - sx0) * out.itemsize;
        copy->source = (const char *)source->buf + sy0 * source->strides[1] + sx0 * source->strides[2];
        copy->target = (char *)out.buf + slot * out.strides[0] + dy0 * out.strides[2] + dx0 * out.strides[3];
        copy->source_channel_stride = source->strides[0];
        copy->source_row_stride = source->strides[1];
        copy->target_channel_stride = out.strides[1];
        copy->target_row_stride = out.strides[2];
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t p = 0; p < count; p++) {
        const Copy *copy = &copies[p];
        for (Py_ssize_t c = 0; c < copy->channels; c++) {
            const char *from = copy->source + (copy->offsets ? copy->offsets[c] : c) * copy->source_channel_stride;
            char *to = copy->target + (copy->positions ? copy->positions[c] : c) * copy->target_channel_stride;
            for (Py_ssize_t row = 0; row < copy->rows; row++) {
                memcpy(to, from, (size_t)copy->row_bytes);
                from += copy->source_row_stride;
                to += copy->target_row_stride;
            }
        }
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    for (Py_ssize_t i = 0; i < held; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(copies);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"copy_pieces", copy_pieces, METH_VARARGS,
     "copy_pieces(pieces, chunks, out): copy each (crop, chunk) piece from its chunk into out (B, C, H, W)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cropbench.formats._copy",
                                    "The direct reader's piece copies, without the GIL.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__copy(void) { return PyModule_Create(&module); }
