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
 * plan_pieces: the (crop, chunk) pieces of a batch's regions, written into the array of piece
 * records copy_pieces and load_chunks take; the same integer arithmetic as the reader's Python
 * planner, without its per-piece Python.
 *
 * What each function takes (arrays of records, whose layout records.py defines once) is described
 * in cropbench/formats/direct/native.py.
 *
 * copy_pieces: copy every (crop, chunk) piece of a batch from its decoded chunk into the output.
 * The pieces are read and checked with the GIL held, then copied row by row with memcpy without
 * it. Anything this code does not handle (a dtype change, rows that are not contiguous) raises TypeError, and the caller copies those pieces in Python; a
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

/* The records of cropbench/formats/direct/records.py (PIECE, NATIVE_READ, NATIVE_CHUNK, NATIVE_TALLY): rows of
 * int64 fields in this order, passed as C-contiguous 1-D NumPy structured arrays. */
typedef struct {
    int64_t key, slot, group, sy0, sy1, sx0, sx1, dy0, dy1, dx0, dx1;
} PieceRecord;
typedef struct {
    int64_t descriptor, path, start, length, codec, first, end;
} ReadRecord;
typedef struct {
    int64_t offset, size, first_piece, end_piece;
} ChunkRecord;
typedef struct {
    int64_t bytes_read, fetch_ns, decode_ns, chunks_decoded, bytes_decoded;
} TallyRecord;

/* A view of a 1-D C-contiguous array of records of itemsize bytes; TypeError naming it otherwise. */
static int record_buffer(PyObject *object, Py_buffer *view, Py_ssize_t itemsize, int writable, const char *name) {
    if (PyObject_GetBuffer(object, view, writable ? PyBUF_RECORDS : PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s is not a%s array", name, writable ? " writable" : "n");
        return -1;
    }
    if (view->ndim != 1 || view->itemsize != itemsize || !PyBuffer_IsContiguous(view, 'C')) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "%s is not a C-contiguous 1-D array of %zd-byte records (its dtype in records.py)",
                     name, itemsize);
        return -1;
    }
    return 0;
}

/* A channel group: its channel count (-1: all, in order) and its indices in the output and the chunk. */
typedef struct {
    Py_ssize_t count;
    const int64_t *positions, *offsets; /* NULL with count -1 */
    int64_t max_position, max_offset;   /* -1 when none */
} Group;

/* The channel table (groups, 1 + 2 * width) int64 as Groups (PyMem; the view holds the indices). */
static Group *channel_groups(PyObject *object, Py_buffer *view, Py_ssize_t *count) {
    if (int64_buffer(object, view, 2, "channels") < 0) return NULL;
    Py_ssize_t columns = view->shape[1], width = (columns - 1) / 2;
    *count = view->shape[0];
    Group *groups = PyMem_Calloc(*count ? *count : 1, sizeof(Group));
    if (groups == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    if (columns < 1 || columns % 2 == 0) {
        PyErr_SetString(PyExc_ValueError, "channels is not (groups, 1 + 2 * width)");
        goto fail;
    }
    for (Py_ssize_t g = 0; g < *count; g++) {
        const int64_t *row = (const int64_t *)view->buf + g * columns;
        Group *group = &groups[g];
        group->count = (Py_ssize_t)row[0];
        group->max_position = group->max_offset = -1;
        if (group->count == -1) continue;
        if (group->count < -1 || group->count > width) {
            PyErr_Format(PyExc_ValueError, "channel group %zd counts %lld channels, not -1 or 0..%zd", g,
                         (long long)row[0], width);
            goto fail;
        }
        group->positions = row + 1;
        group->offsets = row + 1 + width;
        for (Py_ssize_t c = 0; c < group->count; c++) {
            if (group->positions[c] < 0 || group->offsets[c] < 0) {
                PyErr_SetString(PyExc_ValueError, "channel index outside the chunk or the output");
                goto fail;
            }
            if (group->positions[c] > group->max_position) group->max_position = group->positions[c];
            if (group->offsets[c] > group->max_offset) group->max_offset = group->offsets[c];
        }
    }
    return groups;
fail:
    PyMem_Free(groups);
    PyBuffer_Release(view);
    return NULL;
}

/* Check one piece against its chunk (source), the channel groups and the output, and fill in its
 * Copy; -1 with an exception set. */
static int parse_piece(const PieceRecord *piece, Py_ssize_t index, const Py_buffer *source, const Py_buffer *out,
                       const Group *groups, Py_ssize_t group_count, Copy *copy) {
    if (source->ndim != 3 || source->strides[2] != source->itemsize || source->itemsize != out->itemsize ||
        !same_format(source->format, out->format)) {
        PyErr_SetString(PyExc_TypeError, "a chunk is not a (C, H, W) array of the output's type with contiguous rows");
        return -1;
    }
    int64_t slot = piece->slot, sy0 = piece->sy0, sy1 = piece->sy1, sx0 = piece->sx0, sx1 = piece->sx1;
    int64_t dy0 = piece->dy0, dy1 = piece->dy1, dx0 = piece->dx0, dx1 = piece->dx1;
    if (slot < 0 || slot >= out->shape[0] || sy0 < 0 || sy1 > source->shape[1] || sy0 > sy1 || sx0 < 0 ||
        sx1 > source->shape[2] || sx0 > sx1 || dy0 < 0 || dy1 > out->shape[2] || dx0 < 0 || dx1 > out->shape[3] ||
        dy1 - dy0 != sy1 - sy0 || dx1 - dx0 != sx1 - sx0) {
        PyErr_Format(PyExc_ValueError, "piece %zd lies outside its chunk or its output slot", index);
        return -1;
    }
    if (piece->group < 0 || piece->group >= group_count) {
        PyErr_Format(PyExc_ValueError, "piece %zd names channel group %lld of %zd", index, (long long)piece->group,
                     group_count);
        return -1;
    }
    const Group *group = &groups[piece->group];
    if (group->count < 0) {
        if (source->shape[0] != out->shape[1]) {
            PyErr_Format(PyExc_ValueError, "piece %zd selects different channel counts in its chunk and the output",
                         index);
            return -1;
        }
        copy->channels = out->shape[1];
    } else {
        if (group->max_position >= out->shape[1] || group->max_offset >= source->shape[0]) {
            PyErr_SetString(PyExc_ValueError, "channel index outside the chunk or the output");
            return -1;
        }
        copy->channels = group->count;
    }
    copy->positions = group->positions;
    copy->offsets = group->offsets;
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
    PyObject *pieces_object, *channels_object, *chunks, *out_object;
    if (!PyArg_ParseTuple(args, "OOO!O", &pieces_object, &channels_object, &PyDict_Type, &chunks, &out_object))
        return NULL;
    Py_buffer out, pieces, channels;
    Py_ssize_t group_count = 0;
    if (output_buffer(out_object, &out) < 0) return NULL;
    if (record_buffer(pieces_object, &pieces, sizeof(PieceRecord), 0, "pieces") < 0) {
        PyBuffer_Release(&out);
        return NULL;
    }
    Group *groups = channel_groups(channels_object, &channels, &group_count);
    if (groups == NULL) {
        PyBuffer_Release(&pieces);
        PyBuffer_Release(&out);
        return NULL;
    }
    const PieceRecord *records = pieces.buf;
    Py_ssize_t count = pieces.shape[0];
    Copy *copies = PyMem_Calloc(count ? count : 1, sizeof(Copy));
    Py_buffer *views = PyMem_Calloc(count ? count : 1, sizeof(Py_buffer)); /* the chunks' buffers */
    Py_ssize_t held = 0;
    PyObject *result = NULL, *last_chunk = NULL;
    Py_buffer *source = NULL;
    if (copies == NULL || views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t p = 0; p < count; p++) {
        /* pieces come chunk by chunk: one look-up and one buffer per run of a chunk's pieces */
        if (p == 0 || records[p].key != records[p - 1].key) {
            PyObject *key = PyLong_FromLongLong((long long)records[p].key);
            if (key == NULL) goto done;
            PyObject *chunk = PyDict_GetItemWithError(chunks, key);
            Py_DECREF(key);
            if (chunk == NULL) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_KeyError, "a piece's chunk is not among the chunks given");
                goto done;
            }
            if (chunk != last_chunk) {
                source = &views[held];
                if (PyObject_GetBuffer(chunk, source, PyBUF_RECORDS_RO) < 0) goto done;
                held++;
                last_chunk = chunk;
            }
        }
        if (parse_piece(&records[p], p, source, &out, groups, group_count, &copies[p]) < 0) goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    run_copies(copies, 0, count);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    for (Py_ssize_t i = 0; i < held; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(copies);
    PyMem_Free(groups);
    PyBuffer_Release(&channels);
    PyBuffer_Release(&pieces);
    PyBuffer_Release(&out);
    return result;
}

/* ---- plan_pieces ---------------------------------------------------------------------------- */

static PyObject *plan_pieces(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *pieces_object, *regions_object, *slots_object, *group_chunks_object;
    Py_ssize_t chunk_y, chunk_x, group_base;
    int field_shift, c_shift, x_bits;
    if (!PyArg_ParseTuple(args, "OOOnnOniii", &pieces_object, &regions_object, &slots_object, &chunk_y, &chunk_x,
                          &group_chunks_object, &group_base, &field_shift, &c_shift, &x_bits))
        return NULL;
    if (chunk_y <= 0 || chunk_x <= 0) {
        PyErr_SetString(PyExc_ValueError, "chunk sizes must be positive");
        return NULL;
    }
    Py_buffer pieces = {0}, regions = {0}, slots = {0}, group_chunks = {0};
    int have_slots = 0, have_pieces = 0, have_groups = 0;
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
    if (int64_buffer(group_chunks_object, &group_chunks, 1, "group chunks") < 0) goto done;
    have_groups = 1;
    if (record_buffer(pieces_object, &pieces, sizeof(PieceRecord), 1, "pieces") < 0) goto done;
    have_pieces = 1;
    PieceRecord *record = pieces.buf;
    Py_ssize_t capacity = pieces.shape[0], written = 0;
    const int64_t *field = regions.buf, *y0 = field + count, *y1 = y0 + count, *x0 = y1 + count, *x1 = x0 + count;
    const int64_t *out_y0 = x1 + count, *out_x0 = out_y0 + count, *chunks_c = group_chunks.buf;
    for (Py_ssize_t g = 0; g < group_chunks.shape[0]; g++) {
        for (Py_ssize_t r = 0; r < count; r++) {
            if (y0[r] < 0 || x0[r] < 0 || y1[r] <= y0[r] || x1[r] <= x0[r] || field[r] < 0) {
                PyErr_Format(PyExc_ValueError, "region %zd is empty or starts before its field", r);
                goto done;
            }
            int64_t slot = have_slots ? ((const int64_t *)slots.buf)[r] : (int64_t)r;
            int64_t base = field[r] << field_shift | chunks_c[g] << c_shift;
            for (int64_t iy = y0[r] / chunk_y; iy <= (y1[r] - 1) / chunk_y; iy++) {
                int64_t top = iy * chunk_y;
                int64_t sy0 = (y0[r] > top ? y0[r] : top) - top, sy1 = (y1[r] < top + chunk_y ? y1[r] : top + chunk_y) - top;
                int64_t dy0 = top + sy0 - y0[r] + out_y0[r];
                for (int64_t ix = x0[r] / chunk_x; ix <= (x1[r] - 1) / chunk_x; ix++) {
                    if (written == capacity) {
                        PyErr_SetString(PyExc_ValueError, "the regions have more pieces than the pieces array holds");
                        goto done;
                    }
                    int64_t left = ix * chunk_x;
                    int64_t sx0 = (x0[r] > left ? x0[r] : left) - left;
                    int64_t sx1 = (x1[r] < left + chunk_x ? x1[r] : left + chunk_x) - left;
                    int64_t dx0 = left + sx0 - x0[r] + out_x0[r];
                    PieceRecord *piece = &record[written++];
                    piece->key = base | iy << x_bits | ix;
                    piece->slot = slot;
                    piece->group = group_base + g;
                    piece->sy0 = sy0;
                    piece->sy1 = sy1;
                    piece->sx0 = sx0;
                    piece->sx1 = sx1;
                    piece->dy0 = dy0;
                    piece->dy1 = dy0 + sy1 - sy0;
                    piece->dx0 = dx0;
                    piece->dx1 = dx0 + sx1 - sx0;
                }
            }
        }
    }
    result = PyLong_FromSsize_t(written);
done:
    if (have_pieces) PyBuffer_Release(&pieces);
    if (have_groups) PyBuffer_Release(&group_chunks);
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
    Py_ssize_t first_piece, end_piece; /* the copies of its pieces: copies[first_piece:end_piece] */
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
    PyObject *read_object, *path_list, *chunk_object, *array_list, *tally_object;
    PyObject *piece_object = NULL, *channels_object = NULL, *out_object = NULL;
    if (!PyArg_ParseTuple(args, "OO!OO!O|OOO", &read_object, &PyList_Type, &path_list, &chunk_object, &PyList_Type,
                          &array_list, &tally_object, &piece_object, &channels_object, &out_object))
        return NULL;
    if ((piece_object == NULL) != (out_object == NULL) || (piece_object == NULL) != (channels_object == NULL)) {
        PyErr_SetString(PyExc_TypeError, "pieces, channels and out come together");
        return NULL;
    }
    Py_buffer read_view = {0}, chunk_view = {0}, piece_view = {0}, channels = {0}, out = {0}, tally_view = {0};
    int have_reads = 0, have_chunks = 0, have_pieces = 0, have_out = 0, have_tally = 0;
    Read *reads = NULL;
    Chunk *chunks = NULL;
    Copy *copies = NULL;
    Group *groups = NULL;
    Py_ssize_t group_count = 0, held = 0, failed_read = -1, read_count = 0, chunk_count = 0, piece_count = 0;
    PyObject *result = NULL;
    if (record_buffer(read_object, &read_view, sizeof(ReadRecord), 0, "reads") < 0) goto done;
    have_reads = 1;
    if (record_buffer(chunk_object, &chunk_view, sizeof(ChunkRecord), 0, "chunks") < 0) goto done;
    have_chunks = 1;
    if (record_buffer(tally_object, &tally_view, sizeof(TallyRecord), 1, "tally") < 0) goto done;
    have_tally = 1;
    if (tally_view.shape[0] != 1) {
        PyErr_SetString(PyExc_ValueError, "tally is not one record");
        goto done;
    }
    read_count = read_view.shape[0];
    chunk_count = chunk_view.shape[0];
    if (PyList_GET_SIZE(array_list) != chunk_count) {
        PyErr_SetString(PyExc_ValueError, "arrays and chunks differ in length");
        goto done;
    }
    if (piece_object != NULL) {
        if (output_buffer(out_object, &out) < 0) goto done;
        have_out = 1;
        if (record_buffer(piece_object, &piece_view, sizeof(PieceRecord), 0, "pieces") < 0) goto done;
        have_pieces = 1;
        piece_count = piece_view.shape[0];
        groups = channel_groups(channels_object, &channels, &group_count);
        if (groups == NULL) goto done;
    }
    const ReadRecord *read_records = read_view.buf;
    const ChunkRecord *chunk_records = chunk_view.buf;
    const PieceRecord *piece_records = piece_view.buf;
    reads = PyMem_Calloc(read_count ? read_count : 1, sizeof(Read));
    chunks = PyMem_Calloc(chunk_count ? chunk_count : 1, sizeof(Chunk));
    if (reads == NULL || chunks == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t r = 0; r < read_count; r++) {
        const ReadRecord *record = &read_records[r];
        Read *read = &reads[r];
        read->descriptor = (int)record->descriptor;
        read->start = (Py_ssize_t)record->start;
        read->length = (Py_ssize_t)record->length;
        read->codec = (int)record->codec;
        read->first = (Py_ssize_t)record->first;
        read->end = (Py_ssize_t)record->end;
        if (record->descriptor < 0) {
            PyObject *path;
            if (record->descriptor != -1 || record->path < 0 || record->path >= PyList_GET_SIZE(path_list) ||
                !PyBytes_Check(path = PyList_GET_ITEM(path_list, record->path)))
                goto bad_read;
            read->path = PyBytes_AS_STRING(path); /* the list keeps the bytes alive */
        } else if (record->descriptor > INT32_MAX || read->start < 0 || read->length < 0) {
            goto bad_read;
        }
        if ((read->codec != CODEC_RAW && read->codec != CODEC_BLOSC) ||
            (read->codec == CODEC_BLOSC && blosc_decompress_ctx == NULL) || read->first < 0 ||
            read->end < read->first || read->end > chunk_count || (r > 0 && read->first != reads[r - 1].end))
            goto bad_read;
        continue;
    bad_read:
        PyErr_Format(PyExc_ValueError, "read %zd is not a descriptor or a path's index, a known codec and its "
                                       "chunks in order", r);
        goto done;
    }
    if (read_count > 0 && reads[read_count - 1].end != chunk_count) {
        PyErr_SetString(PyExc_ValueError, "the reads do not cover every chunk");
        goto done;
    }
    Py_ssize_t copy_count = 0; /* the chunks' pieces, one Copy each, chunk by chunk */
    for (Py_ssize_t c = 0; c < chunk_count; c++) {
        const ChunkRecord *record = &chunk_records[c];
        if (record->offset < 0 || record->size < -1) {
            PyErr_Format(PyExc_ValueError, "chunk %zd has a negative offset or size", c);
            goto done;
        }
        if (have_pieces && (record->first_piece < 0 || record->end_piece < record->first_piece ||
                            record->end_piece > piece_count)) {
            PyErr_Format(PyExc_ValueError, "chunk %zd's pieces are not a range of the pieces given", c);
            goto done;
        }
        if (have_pieces) copy_count += (Py_ssize_t)(record->end_piece - record->first_piece);
    }
    copies = PyMem_Calloc(copy_count ? copy_count : 1, sizeof(Copy));
    if (copies == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    copy_count = 0;
    for (Py_ssize_t c = 0; c < chunk_count; c++) {
        const ChunkRecord *record = &chunk_records[c];
        Chunk *chunk = &chunks[c];
        chunk->offset = (Py_ssize_t)record->offset;
        chunk->size = (Py_ssize_t)record->size;
        if (PyObject_GetBuffer(PyList_GET_ITEM(array_list, c), &chunk->target, PyBUF_RECORDS) < 0) goto done;
        held = c + 1;
        if (!PyBuffer_IsContiguous(&chunk->target, 'C')) {
            PyErr_Format(PyExc_ValueError, "chunk %zd's array is not C-contiguous", c);
            goto done;
        }
        chunk->first_piece = chunk->end_piece = copy_count;
        if (!have_pieces) continue; /* nothing to copy */
        for (int64_t p = record->first_piece; p < record->end_piece; p++)
            if (parse_piece(&piece_records[p], (Py_ssize_t)p, &chunk->target, &out, groups, group_count,
                            &copies[copy_count++]) < 0)
                goto done;
        chunk->end_piece = copy_count;
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
    TallyRecord *tally = tally_view.buf;
    tally->bytes_read = bytes_read;
    tally->fetch_ns = fetch_ns;
    tally->decode_ns = decode_ns;
    tally->chunks_decoded = decoded_chunks;
    tally->bytes_decoded = decoded_bytes;
    result = absent;
done:
    for (Py_ssize_t c = 0; c < held; c++) PyBuffer_Release(&chunks[c].target);
    if (groups != NULL) PyBuffer_Release(&channels);
    if (have_pieces) PyBuffer_Release(&piece_view);
    if (have_out) PyBuffer_Release(&out);
    if (have_chunks) PyBuffer_Release(&chunk_view);
    if (have_reads) PyBuffer_Release(&read_view);
    if (have_tally) PyBuffer_Release(&tally_view);
    PyMem_Free(groups);
    PyMem_Free(copies);
    PyMem_Free(chunks);
    PyMem_Free(reads);
    return result;
}

static PyMethodDef methods[] = {
    {"copy_pieces", copy_pieces, METH_VARARGS,
     "copy_pieces(pieces, channels, chunks, out): copy each (crop, chunk) piece from its chunk into out (B, C, H, W)."},
    {"plan_pieces", plan_pieces, METH_VARARGS,
     "plan_pieces(pieces, regions, slots, chunk_y, chunk_x, group_chunks, group_base, field_shift, c_shift, x_bits): "
     "write the (crop, chunk) pieces of regions (7 x n int64) into pieces; gives how many."},
    {"bind_blosc", bind_blosc, METH_VARARGS,
     "bind_blosc(path): find c-blosc in numcodecs' loaded blosc module at path; False when it is not there."},
    {"load_chunks", load_chunks, METH_VARARGS,
     "load_chunks(reads, paths, chunks, arrays, tally[, pieces, channels, out]): read and decode every chunk, and copy "
     "its pieces into out right after; the indices of reads whose file does not exist (the counts and clocks written "
     "into tally), or None when the Python path must read them."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cropbench.formats._native",
                                    "The direct reader's chunk loads and piece copies, without the GIL.", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
