/* The direct reader's hot loops in C, each with the GIL released for a whole batch:
 *
 * load_chunks: read the byte ranges (or whole chunk files) of a thread's share of a batch, decode
 * every chunk in them into arrays given by the caller, and copy the pieces of each chunk into the
 * output right after decoding it, while it is in the CPU's cache. The Python loop this replaces spent
 * about 15 microseconds of interpreter time per chunk (numcodecs' wrapper, frombuffer, reshape,
 * the read call) around a decode of about 20; with decode threads that time ran one thread at a
 * time. The codec is numcodecs' own c-blosc, looked up in its extension module (bind_blosc), so
 * the bytes are those numcodecs would decode. Anything unusual (a short read, a chunk blosc does
 * not validate, a size that is not the chunk's) makes the call return None having raised
 * nothing: the caller reads those chunks again on the Python path, which decodes them or raises
 * the error it always raised.
 *
 * plan_pieces: the (crop, chunk) pieces of a batch's regions as the tuples copy_pieces and
 * load_chunks take, grouped by chunk key as they are made; the same integer arithmetic as the
 * reader's numpy planner, without its dozens of array calls and per-piece Python on small batches.
 *
 * copy_pieces: copy every (crop, chunk) piece of a batch from its decoded chunk into the output.
 * The pieces are read and checked with the GIL held, then copied row by row with memcpy without
 * it. Anything this code does not handle (a dtype change, rows that are not contiguous, channel
 * indices that are not int64) raises TypeError, and the caller copies those pieces in Python; a
 * piece outside its chunk or its slot raises ValueError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

/* A view of a C-contiguous int64 array of ndim dimensions; TypeError naming it otherwise. */
static int int64_buffer(PyObject *object, Py_buffer *view, int ndim, const char *name) {
    if (PyObject_GetBuffer(object, view, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s is not an array", name);
        return -1;
    }
    if (view->ndim != ndim || view->itemsize != 8 || !(same_format(view->format, "q") || same_format(view->format, "l")) ||
        !PyBuffer_IsContiguous(view, 'C')) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "%s is not a C-contiguous %d-D int64 array", name, ndim);
        return -1;
    }
    return 0;
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
    if (int64_buffer(selection, view, 1, "channel selection") < 0) return -1;
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

/* Check one piece (a 12-tuple) against its chunk (source) and the output, and fill in its Copy.
 * Channel selections given as arrays are held in views[*held...]; -1 with an exception set. */
static int parse_piece(PyObject *piece, Py_ssize_t index, const Py_buffer *source, const Py_buffer *out, Copy *copy,
                       Py_buffer *views, Py_ssize_t *held) {
    if (!PyTuple_Check(piece) || PyTuple_GET_SIZE(piece) != 12) {
        PyErr_SetString(PyExc_TypeError, "a piece is not a 12-tuple");
        return -1;
    }
    Py_ssize_t at[12];
    for (int i = 4; i < 12; i++)
        if (as_index(PyTuple_GET_ITEM(piece, i), &at[i]) < 0) return -1;
    if (as_index(PyTuple_GET_ITEM(piece, 1), &at[1]) < 0) return -1;
    if (source->ndim != 3 || source->strides[2] != source->itemsize || source->itemsize != out->itemsize ||
        !same_format(source->format, out->format)) {
        PyErr_SetString(PyExc_TypeError, "a chunk is not a (C, H, W) array of the output's type with contiguous rows");
        return -1;
    }
    Py_ssize_t slot = at[1], sy0 = at[4], sy1 = at[5], sx0 = at[6], sx1 = at[7];
    Py_ssize_t dy0 = at[8], dy1 = at[9], dx0 = at[10], dx1 = at[11];
    if (slot < 0 || slot >= out->shape[0] || sy0 < 0 || sy1 > source->shape[1] || sy0 > sy1 || sx0 < 0 ||
        sx1 > source->shape[2] || sx0 > sx1 || dy0 < 0 || dy1 > out->shape[2] || dx0 < 0 || dx1 > out->shape[3] ||
        dy1 - dy0 != sy1 - sy0 || dx1 - dx0 != sx1 - sx0) {
        PyErr_Format(PyExc_ValueError, "piece %zd lies outside its chunk or its output slot", index);
        return -1;
    }
    Py_ssize_t positions_count, offsets_count;
    if (channel_indices(PyTuple_GET_ITEM(piece, 2), &views[*held], &copy->positions, &positions_count,
                        out->shape[1]) < 0)
        return -1;
    if (copy->positions != NULL) (*held)++;
    if (channel_indices(PyTuple_GET_ITEM(piece, 3), &views[*held], &copy->offsets, &offsets_count,
                        source->shape[0]) < 0)
        return -1;
    if (copy->offsets != NULL) (*held)++;
    Py_ssize_t channels = positions_count >= 0 ? positions_count : offsets_count >= 0 ? offsets_count : out->shape[1];
    if ((positions_count >= 0 && positions_count != channels) || (offsets_count >= 0 && offsets_count != channels) ||
        (positions_count < 0 && channels > out->shape[1]) || (offsets_count < 0 && channels > source->shape[0]) ||
        (positions_count < 0 && offsets_count < 0 && source->shape[0] != out->shape[1])) {
        PyErr_Format(PyExc_ValueError, "piece %zd selects different channel counts in its chunk and the output", index);
        return -1;
    }
    copy->channels = channels;
    copy->rows = sy1 - sy0;
    copy->row_bytes = (sx1 - sx0) * out->itemsize;
    copy->source = (const char *)source->buf + sy0 * source->strides[1] + sx0 * source->strides[2];
    copy->target = (char *)out->buf + slot * out->strides[0] + dy0 * out->strides[2] + dx0 * out->strides[3];
    copy->source_channel_stride = source->strides[0];
    copy->source_row_stride = source->strides[1];
    copy->target_channel_stride = out->strides[1];
    copy->target_row_stride = out->strides[2];
    return 0;
}

/* The copies [begin, end); no Python object is touched (the GIL may be released). */
static void run_copies(const Copy *copies, Py_ssize_t begin, Py_ssize_t end) {
    for (Py_ssize_t p = begin; p < end; p++) {
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
}

static int output_buffer(PyObject *object, Py_buffer *out) {
    if (PyObject_GetBuffer(object, out, PyBUF_RECORDS) < 0) return -1;
    if (out->ndim != 4 || out->strides[3] != out->itemsize) {
        PyBuffer_Release(out);
        PyErr_SetString(PyExc_TypeError, "output is not a (B, C, H, W) array with contiguous rows");
        return -1;
    }
    return 0;
}

static PyObject *copy_pieces(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *pieces, *chunks, *out_object;
    if (!PyArg_ParseTuple(args, "O!O!O", &PyList_Type, &pieces, &PyDict_Type, &chunks, &out_object)) return NULL;
    Py_buffer out;
    if (output_buffer(out_object, &out) < 0) return NULL;
    Py_ssize_t count = PyList_GET_SIZE(pieces);
    Copy *copies = PyMem_Calloc(count ? count : 1, sizeof(Copy));
    /* every buffer taken: chunks and channel selections, released once the copies are done */
    Py_buffer *views = PyMem_Calloc(count ? 3 * count : 1, sizeof(Py_buffer));
    Py_ssize_t held = 0;
    PyObject *result = NULL, *last_chunk = NULL;
    Py_buffer *source = NULL;
    if (copies == NULL || views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t p = 0; p < count; p++) {
        PyObject *piece = PyList_GET_ITEM(pieces, p);
        if (!PyTuple_Check(piece) || PyTuple_GET_SIZE(piece) != 12) {
            PyErr_SetString(PyExc_TypeError, "a piece is not a 12-tuple");
            goto done;
        }
        PyObject *chunk = PyDict_GetItemWithError(chunks, PyTuple_GET_ITEM(piece, 0));
        if (chunk == NULL) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_KeyError, "a piece's chunk is not among the chunks given");
            goto done;
        }
        if (chunk != last_chunk) { /* pieces come chunk by chunk: one buffer per run of a chunk's pieces */
            source = &views[held];
            if (PyObject_GetBuffer(chunk, source, PyBUF_RECORDS_RO) < 0) goto done;
            held++;
            last_chunk = chunk;
        }
        if (parse_piece(piece, p, source, &out, &copies[p], views, &held) < 0) goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    run_copies(copies, 0, count);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    for (Py_ssize_t i = 0; i < held; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(copies);
    PyBuffer_Release(&out);
    return result;
}

/* ---- plan_pieces ---------------------------------------------------------------------------- */

/* Append the piece to the pieces list and to its chunk's list in by_chunk; -1 with an exception set. */
static int add_piece(PyObject *pieces, PyObject *by_chunk, long long key, Py_ssize_t slot, PyObject *positions,
                     PyObject *offsets, const Py_ssize_t numbers[8]) {
    PyObject *piece = PyTuple_New(12), *key_object = PyLong_FromLongLong(key), *slot_object = PyLong_FromSsize_t(slot);
    if (piece == NULL || key_object == NULL || slot_object == NULL) goto fail;
    PyTuple_SET_ITEM(piece, 0, key_object);
    PyTuple_SET_ITEM(piece, 1, slot_object);
    key_object = slot_object = NULL; /* the tuple owns them now */
    PyTuple_SET_ITEM(piece, 2, Py_NewRef(positions));
    PyTuple_SET_ITEM(piece, 3, Py_NewRef(offsets));
    for (int i = 0; i < 8; i++) {
        PyObject *number = PyLong_FromSsize_t(numbers[i]);
        if (number == NULL) goto fail;
        PyTuple_SET_ITEM(piece, 4 + i, number);
    }
    if (PyList_Append(pieces, piece) < 0) goto fail;
    PyObject *listed = PyDict_GetItemWithError(by_chunk, PyTuple_GET_ITEM(piece, 0));
    if (listed == NULL) {
        if (PyErr_Occurred()) goto fail;
        listed = PyList_New(0);
        if (listed == NULL) goto fail;
        int stored = PyDict_SetItem(by_chunk, PyTuple_GET_ITEM(piece, 0), listed);
        Py_DECREF(listed); /* the dict holds it */
        if (stored < 0) goto fail;
    }
    if (PyList_Append(listed, piece) < 0) goto fail;
    Py_DECREF(piece);
    return 0;
fail:
    Py_XDECREF(piece);
    Py_XDECREF(key_object);
    Py_XDECREF(slot_object);
    return -1;
}

static PyObject *plan_pieces(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *pieces, *regions_object, *slots_object, *groups, *by_chunk;
    Py_ssize_t chunk_y, chunk_x;
    int field_shift, c_shift, x_bits;
    if (!PyArg_ParseTuple(args, "O!O!OOnnO!iii", &PyList_Type, &pieces, &PyDict_Type, &by_chunk, &regions_object,
                          &slots_object, &chunk_y, &chunk_x, &PyList_Type, &groups, &field_shift, &c_shift, &x_bits))
        return NULL;
    if (chunk_y <= 0 || chunk_x <= 0) {
        PyErr_SetString(PyExc_ValueError, "chunk sizes must be positive");
        return NULL;
    }
    Py_buffer regions = {0}, slots = {0};
    int have_slots = 0;
    PyObject *result = NULL;
    if (int64_buffer(regions_object, &regions, 2, "regions") < 0) return NULL;
    if (regions.shape[0] != 7) {
        PyErr_SetString(PyExc_ValueError, "regions are not 7 columns (field, y0, y1, x0, x1, out_y0, out_x0)");
        goto done;
    }
    Py_ssize_t count = regions.shape[1];
    if (slots_object != Py_None) {
        if (int64_buffer(slots_object, &slots, 1, "slots") < 0) goto done;
        have_slots = 1;
        if (slots.shape[0] != count) {
            PyErr_SetString(PyExc_ValueError, "slots and regions differ in length");
            goto done;
        }
    }
    const int64_t *field = regions.buf, *y0 = field + count, *y1 = y0 + count, *x0 = y1 + count, *x1 = x0 + count;
    const int64_t *out_y0 = x1 + count, *out_x0 = out_y0 + count;
    for (Py_ssize_t g = 0; g < PyList_GET_SIZE(groups); g++) {
        PyObject *group = PyList_GET_ITEM(groups, g), *positions, *offsets;
        long long c_index;
        if (!PyTuple_Check(group) || !PyArg_ParseTuple(group, "LOO", &c_index, &positions, &offsets)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a channel group is not (chunk, positions, offsets)");
            goto done;
        }
        for (Py_ssize_t r = 0; r < count; r++) {
            if (y0[r] < 0 || x0[r] < 0 || y1[r] <= y0[r] || x1[r] <= x0[r] || field[r] < 0) {
                PyErr_Format(PyExc_ValueError, "region %zd is empty or starts before its field", r);
                goto done;
            }
            Py_ssize_t slot = have_slots ? (Py_ssize_t)((const int64_t *)slots.buf)[r] : r;
            long long base = (long long)field[r] << field_shift | c_index << c_shift;
            for (int64_t iy = y0[r] / chunk_y; iy <= (y1[r] - 1) / chunk_y; iy++) {
                int64_t top = iy * chunk_y;
                int64_t sy0 = (y0[r] > top ? y0[r] : top) - top, sy1 = (y1[r] < top + chunk_y ? y1[r] : top + chunk_y) - top;
                int64_t dy0 = top + sy0 - y0[r] + out_y0[r];
                for (int64_t ix = x0[r] / chunk_x; ix <= (x1[r] - 1) / chunk_x; ix++) {
                    int64_t left = ix * chunk_x;
                    int64_t sx0 = (x0[r] > left ? x0[r] : left) - left;
                    int64_t sx1 = (x1[r] < left + chunk_x ? x1[r] : left + chunk_x) - left;
                    int64_t dx0 = left + sx0 - x0[r] + out_x0[r];
                    Py_ssize_t numbers[8] = {sy0, sy1, sx0, sx1, dy0, dy0 + sy1 - sy0, dx0, dx0 + sx1 - sx0};
                    if (add_piece(pieces, by_chunk, base | iy << x_bits | ix, slot, positions, offsets, numbers) < 0)
                        goto done;
                }
            }
        }
    }
    result = Py_NewRef(Py_None);
done:
    if (have_slots) PyBuffer_Release(&slots);
    PyBuffer_Release(&regions);
    return result;
}

/* ---- load_chunks ---------------------------------------------------------------------------- */

/* c-blosc 1.x's reentrant calls, as numcodecs' blosc extension module exports them. */
typedef int (*blosc_validate_fn)(const void *cbuffer, size_t cbytes, size_t *nbytes);
typedef int (*blosc_decompress_ctx_fn)(const void *src, void *dest, size_t destsize, int numinternalthreads);
static blosc_validate_fn blosc_validate = NULL;
static blosc_decompress_ctx_fn blosc_decompress_ctx = NULL;

enum { CODEC_RAW = 0, CODEC_BLOSC = 1 };

/* Each thread reads into its own buffer, kept between calls up to this size, rather than asking the
 * allocator (and, for a long run, the kernel: fresh pages) for one per call. */
#define SCRATCH_KEPT_BYTES (16 << 20)
static _Thread_local char *thread_scratch = NULL;
static _Thread_local Py_ssize_t thread_scratch_capacity = 0;

typedef struct {
    int descriptor;       /* an open file, or -1: open path and read it whole */
    const char *path;     /* with descriptor -1 */
    Py_ssize_t start;     /* with a descriptor: the byte range */
    Py_ssize_t length;    /* with -1: the most bytes the file may hold (-1: no bound) */
    int codec;
    Py_ssize_t first, end; /* its chunks: chunks[first:end] */
    int absent;           /* set when the whole file does not exist */
} Read;

typedef struct {
    Py_ssize_t offset, size; /* inside what the read returned; size -1: all of it */
    Py_buffer target;
    Py_ssize_t first_piece, end_piece; /* its pieces: copies[first_piece:end_piece] */
} Chunk;

static PyObject *bind_blosc(PyObject *module, PyObject *args) {
    (void)module;
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path)) return NULL;
    /* the module is loaded already (numcodecs.blosc is imported): this only finds its handle */
    void *handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (handle == NULL) Py_RETURN_FALSE;
    blosc_validate = (blosc_validate_fn)dlsym(handle, "blosc_cbuffer_validate");
    blosc_decompress_ctx = (blosc_decompress_ctx_fn)dlsym(handle, "blosc_decompress_ctx");
    if (blosc_validate == NULL || blosc_decompress_ctx == NULL) {
        blosc_validate = NULL;
        blosc_decompress_ctx = NULL;
        Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

static int64_t now_ns(void) {
    struct timespec clock;
    clock_gettime(CLOCK_MONOTONIC, &clock);
    return (int64_t)clock.tv_sec * 1000000000 + clock.tv_nsec;
}

/* Read length bytes at start into buffer; 0 when all of them came. */
static int read_fully(int descriptor, char *buffer, Py_ssize_t length, Py_ssize_t start) {
    Py_ssize_t done = 0;
    while (done < length) {
        ssize_t got = pread(descriptor, buffer + done, (size_t)(length - done), (off_t)(start + done));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return -1;
        done += got;
    }
    return 0;
}

/* 0 and the bytes of one read in *data (*length of them), or -1 (anything the Python path should see). */
static int fetch(Read *read, char **scratch, Py_ssize_t *capacity, Py_ssize_t *length) {
    int descriptor = read->descriptor;
    Py_ssize_t start = read->start, size = read->length;
    int opened = -1;
    if (descriptor < 0) {
        /* non-blocking, so a FIFO swapped in after the Python side checked the path cannot block the open */
        opened = open(read->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
        if (opened < 0) {
            if (errno == ENOENT) {
                read->absent = 1;
                *length = 0;
                return 0;
            }
            return -1;
        }
        struct stat status;
        /* a regular file no longer than the chunk may be stored in (length; -1: no bound), else the
           Python path, which says why */
        if (fstat(opened, &status) < 0 || !S_ISREG(status.st_mode) ||
            (read->length >= 0 && (Py_ssize_t)status.st_size > read->length)) {
            close(opened);
            return -1;
        }
        descriptor = opened;
        start = 0;
        size = (Py_ssize_t)status.st_size;
    }
    if (size > *capacity) {
        char *larger = realloc(*scratch, (size_t)size);
        if (larger == NULL) {
            if (opened >= 0) close(opened);
            return -1;
        }
        *scratch = larger;
        *capacity = size;
    }
    int failed = read_fully(descriptor, *scratch, size, start);
    if (opened >= 0) close(opened);
    *length = size;
    return failed;
}

static int decode(int codec, const char *source, Py_ssize_t size, Py_buffer *target) {
    if (codec == CODEC_RAW) {
        if (size != target->len) return -1;
        memcpy(target->buf, source, (size_t)size);
        return 0;
    }
    size_t decoded = 0;
    if (blosc_validate(source, (size_t)size, &decoded) != 0 || (Py_ssize_t)decoded != target->len) return -1;
    if (decoded == 0) return 0;
    return blosc_decompress_ctx(source, target->buf, decoded, 1) == (int)decoded ? 0 : -1;
}

static PyObject *load_chunks(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *read_list, *chunk_list, *piece_list = NULL, *out_object = NULL;
    if (!PyArg_ParseTuple(args, "O!O!|O!O", &PyList_Type, &read_list, &PyList_Type, &chunk_list, &PyList_Type,
                          &piece_list, &out_object))
        return NULL;
    if ((piece_list == NULL) != (out_object == NULL)) {
        PyErr_SetString(PyExc_TypeError, "pieces and out come together");
        return NULL;
    }
    Py_ssize_t read_count = PyList_GET_SIZE(read_list), chunk_count = PyList_GET_SIZE(chunk_list);
    Py_ssize_t piece_count = piece_list == NULL ? 0 : PyList_GET_SIZE(piece_list);
    Read *reads = PyMem_Calloc(read_count ? read_count : 1, sizeof(Read));
    Chunk *chunks = PyMem_Calloc(chunk_count ? chunk_count : 1, sizeof(Chunk));
    Copy *copies = PyMem_Calloc(piece_count ? piece_count : 1, sizeof(Copy));
    Py_buffer *views = PyMem_Calloc(piece_count ? 2 * piece_count : 1, sizeof(Py_buffer)); /* channel selections */
    Py_buffer out = {0};
    int have_out = 0;
    Py_ssize_t held = 0, held_views = 0, failed_read = -1;
    PyObject *result = NULL;
    if (reads == NULL || chunks == NULL || copies == NULL || views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (out_object != NULL) {
        if (output_buffer(out_object, &out) < 0) goto done;
        have_out = 1;
    }
    for (Py_ssize_t r = 0; r < read_count; r++) {
        PyObject *item = PyList_GET_ITEM(read_list, r);
        PyObject *path;
        Read *read = &reads[r];
        /* (descriptor, path bytes or None, start, length, codec, first chunk, end chunk) */
        if (!PyTuple_Check(item) ||
            !PyArg_ParseTuple(item, "iOnninn", &read->descriptor, &path, &read->start, &read->length, &read->codec,
                              &read->first, &read->end))
            goto bad_read;
        if (read->descriptor < 0) {
            if (!PyBytes_Check(path)) goto bad_read;
            read->path = PyBytes_AS_STRING(path); /* the list keeps the bytes alive */
        } else if (read->start < 0 || read->length < 0) {
            goto bad_read;
        }
        if ((read->codec != CODEC_RAW && read->codec != CODEC_BLOSC) ||
            (read->codec == CODEC_BLOSC && blosc_decompress_ctx == NULL) || read->first < 0 ||
            read->end < read->first || read->end > chunk_count || (r > 0 && read->first != reads[r - 1].end))
            goto bad_read;
        continue;
    bad_read:
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "read %zd is not (descriptor, path, start, length, codec, first, end) "
                                           "with a known codec and its chunks in order", r);
        goto done;
    }
    if (read_count > 0 && reads[read_count - 1].end != chunk_count) {
        PyErr_SetString(PyExc_ValueError, "the reads do not cover every chunk");
        goto done;
    }
    for (Py_ssize_t c = 0; c < chunk_count; c++) {
        PyObject *item = PyList_GET_ITEM(chunk_list, c), *target;
        Chunk *chunk = &chunks[c];
        if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "nnO|nn", &chunk->offset, &chunk->size, &target,
                                                      &chunk->first_piece, &chunk->end_piece)) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "chunk %zd is not (offset, size, array[, first piece, end piece])", c);
            goto done;
        }
        if (PyObject_GetBuffer(target, &chunk->target, PyBUF_RECORDS) < 0) goto done;
        held = c + 1;
        if (!PyBuffer_IsContiguous(&chunk->target, 'C')) {
            PyErr_Format(PyExc_ValueError, "chunk %zd's array is not C-contiguous", c);
            goto done;
        }
        if (chunk->offset < 0 || chunk->size < -1) {
            PyErr_Format(PyExc_ValueError, "chunk %zd has a negative offset or size", c);
            goto done;
        }
        if (!have_out) chunk->first_piece = chunk->end_piece = 0; /* nothing to copy */
        /* each piece parsed once: the ranges follow one another (views holds two per piece) */
        Py_ssize_t previous_end = c > 0 ? chunks[c - 1].end_piece : 0;
        if (chunk->first_piece < previous_end || chunk->end_piece < chunk->first_piece ||
            chunk->end_piece > piece_count) {
            PyErr_Format(PyExc_ValueError, "chunk %zd's pieces are not a range of the pieces given", c);
            goto done;
        }
        for (Py_ssize_t p = chunk->first_piece; p < chunk->end_piece; p++)
            if (parse_piece(PyList_GET_ITEM(piece_list, p), p, &chunk->target, &out, &copies[p], views, &held_views) < 0)
                goto done;
    }
    int64_t fetch_ns = 0, decode_ns = 0, copy_ns = 0;
    Py_ssize_t bytes_read = 0, decoded_chunks = 0, decoded_bytes = 0;
    Py_BEGIN_ALLOW_THREADS
    char *scratch = thread_scratch;
    Py_ssize_t capacity = thread_scratch_capacity;
    for (Py_ssize_t r = 0; r < read_count && failed_read < 0; r++) {
        Read *read = &reads[r];
        Py_ssize_t length = 0;
        int64_t began = now_ns();
        if (fetch(read, &scratch, &capacity, &length) < 0) {
            failed_read = r;
            break;
        }
        int64_t fetched = now_ns();
        fetch_ns += fetched - began;
        bytes_read += length;
        if (read->absent) continue;
        for (Py_ssize_t c = read->first; c < read->end; c++) {
            Chunk *chunk = &chunks[c];
            Py_ssize_t size = chunk->size < 0 ? length - chunk->offset : chunk->size;
            if (chunk->offset > length || size < 0 || chunk->offset + size > length ||
                decode(read->codec, scratch + chunk->offset, size, &chunk->target) < 0) {
                failed_read = r;
                break;
            }
            decoded_chunks++;
            decoded_bytes += chunk->target.len;
            if (chunk->end_piece > chunk->first_piece) { /* while the chunk is in the CPU's cache */
                int64_t decoded = now_ns();
                run_copies(copies, chunk->first_piece, chunk->end_piece);
                copy_ns += now_ns() - decoded;
            }
        }
        decode_ns += now_ns() - fetched;
    }
    decode_ns -= copy_ns; /* the copies are assembly, not decoding */
    if (capacity > SCRATCH_KEPT_BYTES) { /* a long run read once: give its memory back */
        free(scratch);
        scratch = NULL;
        capacity = 0;
    }
    thread_scratch = scratch;
    thread_scratch_capacity = capacity;
    Py_END_ALLOW_THREADS
    if (failed_read >= 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *absent = PyList_New(0);
    if (absent == NULL) goto done;
    for (Py_ssize_t r = 0; r < read_count; r++) {
        if (!reads[r].absent) continue;
        PyObject *index = PyLong_FromSsize_t(r);
        if (index == NULL || PyList_Append(absent, index) < 0) {
            Py_XDECREF(index);
            Py_DECREF(absent);
            goto done;
        }
        Py_DECREF(index);
    }
    result = Py_BuildValue("(nNLLnn)", bytes_read, absent, (long long)fetch_ns, (long long)decode_ns, decoded_chunks,
                           decoded_bytes);
done:
    for (Py_ssize_t v = 0; v < held_views; v++) PyBuffer_Release(&views[v]);
    for (Py_ssize_t c = 0; c < held; c++) PyBuffer_Release(&chunks[c].target);
    if (have_out) PyBuffer_Release(&out);
    PyMem_Free(views);
    PyMem_Free(copies);
    PyMem_Free(chunks);
    PyMem_Free(reads);
    return result;
}

static PyMethodDef methods[] = {
    {"copy_pieces", copy_pieces, METH_VARARGS,
     "copy_pieces(pieces, chunks, out): copy each (crop, chunk) piece from its chunk into out (B, C, H, W)."},
    {"plan_pieces", plan_pieces, METH_VARARGS,
     "plan_pieces(pieces, by_chunk, regions, slots, chunk_y, chunk_x, groups, field_shift, c_shift, x_bits): append "
     "the (crop, chunk) pieces of regions (7 x n int64) to pieces and to by_chunk[key]."},
    {"bind_blosc", bind_blosc, METH_VARARGS,
     "bind_blosc(path): find c-blosc in numcodecs' loaded blosc module at path; False when it is not there."},
    {"load_chunks", load_chunks, METH_VARARGS,
     "load_chunks(reads, chunks[, pieces, out]): read and decode every chunk, and copy its pieces into out right "
     "after; (bytes read, absent reads, fetch ns, decode ns, chunks decoded, bytes decoded), or None when the "
     "Python path must read them."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cropbench.formats._native",
                                    "The direct reader's chunk loads and piece copies, without the GIL.", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
