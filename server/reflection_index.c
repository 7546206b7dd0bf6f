/*
 * reflection_index.c - symbol index and request codec of server reflection
 * (reflection_index.h).
 *
 * The wire reader knows four wire types (varint, fixed64, length-delimited,
 * fixed32) and checks every length against what is left, so a corrupt set
 * fails with CINFER_E_FORMAT instead of reading out of bounds. It reads only
 * the descriptor fields that declare names:
 *
 *   FileDescriptorSet       1 file (FileDescriptorProto)
 *   FileDescriptorProto     1 name, 2 package, 3 dependency, 4 message_type,
 *                           5 enum_type, 6 service
 *   DescriptorProto         1 name, 2 field, 3 nested_type, 4 enum_type,
 *                           8 oneof_decl
 *   FieldDescriptorProto    1 name (fields, oneofs)
 *   EnumDescriptorProto     1 name, 2 value (EnumValueDescriptorProto 1 name)
 *   ServiceDescriptorProto  1 name, 2 method (MethodDescriptorProto 1 name)
 *
 * Enum values are scoped like C++ enumerators: "pkg.Msg.VALUE", siblings of
 * their enum, as protobuf's DescriptorPool names them.
 */
#include "server/reflection_index.h"

#include <stdlib.h>
#include <string.h>

#include "grpc/reflection/v1/reflection.pb-c.h"

/* ---------------------------------------------------------------------- */
/* Protobuf wire reader                                                   */
/* ---------------------------------------------------------------------- */

typedef struct {
    const uint8_t *p, *end;
} wire;

typedef struct {
    uint32_t field;
    uint32_t type;
    uint64_t varint;     /* type 0 */
    const uint8_t *data; /* type 2 */
    size_t len;          /* type 2 */
} wire_field;

static int read_varint(wire *w, uint64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (w->p >= w->end)
            return 0;
        uint8_t b = *w->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 1;
        }
    }
    return 0;
}

/* Next field: 1 and *f filled, 0 at the end, -1 on malformed input. */
static int next_field(wire *w, wire_field *f)
{
    if (w->p >= w->end)
        return 0;
    uint64_t key;
    if (!read_varint(w, &key) || (key >> 3) == 0 || (key >> 3) > 0x1fffffff)
        return -1;
    f->field = (uint32_t)(key >> 3);
    f->type = (uint32_t)(key & 7);
    switch (f->type) {
    case 0:
        return read_varint(w, &f->varint) ? 1 : -1;
    case 1:
        if (w->end - w->p < 8)
            return -1;
        w->p += 8;
        return 1;
    case 2: {
        uint64_t len;
        if (!read_varint(w, &len) || len > (uint64_t)(w->end - w->p))
            return -1;
        f->data = w->p;
        f->len = (size_t)len;
        w->p += len;
        return 1;
    }
    case 5:
        if (w->end - w->p < 4)
            return -1;
        w->p += 4;
        return 1;
    default:
        return -1;
    }
}

/* ---------------------------------------------------------------------- */
/* Index                                                                  */
/* ---------------------------------------------------------------------- */

typedef struct {
    char *name;
    const uint8_t *bytes; /* the serialized FileDescriptorProto */
    size_t len;
    char **deps;          /* dependency file names */
    size_t n_deps;
} refl_file;

typedef struct {
    char *name;
    int file;
} refl_symbol;

struct cinfer_refl_index {
    refl_file *files;
    size_t n_files;
    refl_symbol *syms;
    size_t n_syms, cap_syms;
    char **services;
    size_t n_services, cap_services;
};

static char *dup_n(const uint8_t *s, size_t n)
{
    char *d = malloc(n + 1);
    if (!d)
        return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

/* "scope" + "." + name[0..n) (no dot when scope is empty). */
static char *join_name(const char *scope, const uint8_t *name, size_t n)
{
    size_t sl = strlen(scope);
    char *d = malloc(sl + 1 + n + 1);
    if (!d)
        return NULL;
    size_t o = 0;
    if (sl) {
        memcpy(d, scope, sl);
        d[sl] = '.';
        o = sl + 1;
    }
    memcpy(d + o, name, n);
    d[o + n] = '\0';
    return d;
}

static cinfer_status add_symbol(cinfer_refl_index *ix, char *name, int file)
{
    if (!name)
        return cinfer_set_error(CINFER_E_NOMEM, "reflection index: no memory");
    if (ix->n_syms == ix->cap_syms) {
        size_t cap = ix->cap_syms ? ix->cap_syms * 2 : 64;
        refl_symbol *s = realloc(ix->syms, cap * sizeof *s);
        if (!s) {
            free(name);
            return cinfer_set_error(CINFER_E_NOMEM,
                                    "reflection index: no memory");
        }
        ix->syms = s;
        ix->cap_syms = cap;
    }
    ix->syms[ix->n_syms].name = name;
    ix->syms[ix->n_syms].file = file;
    ix->n_syms++;
    return CINFER_OK;
}

/* The name (field 1) of a descriptor message, or NULL if it has none. */
static int msg_name(const uint8_t *p, size_t n, const uint8_t **name,
                    size_t *len)
{
    wire w = {p, p + n};
    wire_field f;
    int r;
    *name = NULL;
    *len = 0;
    for (r = next_field(&w, &f); r == 1; r = next_field(&w, &f)) {
        if (f.field == 1 && f.type == 2) {
            *name = f.data;
            *len = f.len;
        }
    }
    return r == 0 && *name != NULL;
}

static cinfer_status bad_set(const char *what)
{
    return cinfer_set_error(CINFER_E_FORMAT,
                            "descriptor set: malformed %s", what);
}

/* Adds an enum and its values. `scope` is where the enum is declared. */
static cinfer_status index_enum(cinfer_refl_index *ix, const char *scope,
                                const uint8_t *p, size_t n, int file)
{
    const uint8_t *name;
    size_t nl;
    if (!msg_name(p, n, &name, &nl))
        return bad_set("EnumDescriptorProto");
    cinfer_status st = add_symbol(ix, join_name(scope, name, nl), file);
    if (st != CINFER_OK)
        return st;
    wire w = {p, p + n};
    wire_field f;
    int r;
    for (r = next_field(&w, &f); r == 1; r = next_field(&w, &f)) {
        if (f.field == 2 && f.type == 2) {
            const uint8_t *vn;
            size_t vl;
            if (!msg_name(f.data, f.len, &vn, &vl))
                return bad_set("EnumValueDescriptorProto");
            st = add_symbol(ix, join_name(scope, vn, vl), file);
            if (st != CINFER_OK)
                return st;
        }
    }
    return r == 0 ? CINFER_OK : bad_set("EnumDescriptorProto");
}

static cinfer_status index_message(cinfer_refl_index *ix, const char *scope,
                                   const uint8_t *p, size_t n, int file,
                                   int depth)
{
    if (depth > 32)
        return bad_set("DescriptorProto (nested too deep)");
    const uint8_t *name;
    size_t nl;
    if (!msg_name(p, n, &name, &nl))
        return bad_set("DescriptorProto");
    char *full = join_name(scope, name, nl);
    if (!full)
        return cinfer_set_error(CINFER_E_NOMEM, "reflection index: no memory");
    char *own = strdup(full);
    cinfer_status st = add_symbol(ix, full, file);
    if (st != CINFER_OK || !own) {
        free(own);
        return st != CINFER_OK ? st
                               : cinfer_set_error(CINFER_E_NOMEM,
                                                  "reflection index: no "
                                                  "memory");
    }
    wire w = {p, p + n};
    wire_field f;
    int r;
    for (r = next_field(&w, &f); r == 1; r = next_field(&w, &f)) {
        if (f.type != 2)
            continue;
        if (f.field == 2 || f.field == 8) { /* field, oneof_decl */
            const uint8_t *fn;
            size_t fl;
            if (!msg_name(f.data, f.len, &fn, &fl)) {
                st = bad_set("FieldDescriptorProto");
                break;
            }
            st = add_symbol(ix, join_name(own, fn, fl), file);
        } else if (f.field == 3) {
            st = index_message(ix, own, f.data, f.len, file, depth + 1);
        } else if (f.field == 4) {
            st = index_enum(ix, own, f.data, f.len, file);
        }
        if (st != CINFER_OK)
            break;
    }
    if (st == CINFER_OK && r != 0)
        st = bad_set("DescriptorProto");
    free(own);
    return st;
}

static cinfer_status index_service(cinfer_refl_index *ix, const char *scope,
                                   const uint8_t *p, size_t n, int file)
{
    const uint8_t *name;
    size_t nl;
    if (!msg_name(p, n, &name, &nl))
        return bad_set("ServiceDescriptorProto");
    char *full = join_name(scope, name, nl);
    if (!full)
        return cinfer_set_error(CINFER_E_NOMEM, "reflection index: no memory");
    if (ix->n_services == ix->cap_services) {
        size_t cap = ix->cap_services ? ix->cap_services * 2 : 8;
        char **s = realloc(ix->services, cap * sizeof *s);
        if (!s) {
            free(full);
            return cinfer_set_error(CINFER_E_NOMEM,
                                    "reflection index: no memory");
        }
        ix->services = s;
        ix->cap_services = cap;
    }
    ix->services[ix->n_services++] = full;
    cinfer_status st = add_symbol(ix, strdup(full), file);
    if (st != CINFER_OK)
        return st;
    wire w = {p, p + n};
    wire_field f;
    int r;
    for (r = next_field(&w, &f); r == 1; r = next_field(&w, &f)) {
        if (f.field == 2 && f.type == 2) {
            const uint8_t *mn;
            size_t ml;
            if (!msg_name(f.data, f.len, &mn, &ml))
                return bad_set("MethodDescriptorProto");
            st = add_symbol(ix, join_name(full, mn, ml), file);
            if (st != CINFER_OK)
                return st;
        }
    }
    return r == 0 ? CINFER_OK : bad_set("ServiceDescriptorProto");
}

static cinfer_status index_file(cinfer_refl_index *ix, int fi)
{
    refl_file *file = &ix->files[fi];
    char *package = NULL;
    wire w = {file->bytes, file->bytes + file->len};
    wire_field f;
    int r;
    cinfer_status st = CINFER_OK;
    /* Pass 1: name, package, dependencies. */
    for (r = next_field(&w, &f); r == 1; r = next_field(&w, &f)) {
        if (f.type != 2)
            continue;
        if (f.field == 1) {
            free(file->name);
            file->name = dup_n(f.data, f.len);
            if (!file->name)
                goto nomem;
        } else if (f.field == 2) {
            free(package);
            package = dup_n(f.data, f.len);
            if (!package)
                goto nomem;
        } else if (f.field == 3) {
            char **d = realloc(file->deps, (file->n_deps + 1) * sizeof *d);
            if (!d)
                goto nomem;
            file->deps = d;
            d[file->n_deps] = dup_n(f.data, f.len);
            if (!d[file->n_deps])
                goto nomem;
            file->n_deps++;
        }
    }
    if (r != 0 || !file->name) {
        free(package);
        return bad_set("FileDescriptorProto");
    }
    /* Pass 2: declarations. */
    const char *scope = package ? package : "";
    w.p = file->bytes;
    for (r = next_field(&w, &f); st == CINFER_OK && r == 1;
         r = next_field(&w, &f)) {
        if (f.type != 2)
            continue;
        if (f.field == 4)
            st = index_message(ix, scope, f.data, f.len, fi, 0);
        else if (f.field == 5)
            st = index_enum(ix, scope, f.data, f.len, fi);
        else if (f.field == 6)
            st = index_service(ix, scope, f.data, f.len, fi);
    }
    free(package);
    return st;
nomem:
    free(package);
    return cinfer_set_error(CINFER_E_NOMEM, "reflection index: no memory");
}

static int cmp_sym(const void *a, const void *b)
{
    return strcmp(((const refl_symbol *)a)->name,
                  ((const refl_symbol *)b)->name);
}

cinfer_status cinfer_refl_index_create(const uint8_t *set, size_t len,
                                       cinfer_refl_index **out)
{
    *out = NULL;
    cinfer_refl_index *ix = calloc(1, sizeof *ix);
    if (!ix)
        return cinfer_set_error(CINFER_E_NOMEM, "reflection index: no memory");
    cinfer_status st = CINFER_OK;
    wire w = {set, set + len};
    wire_field f;
    int r;
    for (r = next_field(&w, &f); r == 1; r = next_field(&w, &f)) {
        if (f.field != 1 || f.type != 2)
            continue;
        refl_file *nf = realloc(ix->files, (ix->n_files + 1) * sizeof *nf);
        if (!nf) {
            st = cinfer_set_error(CINFER_E_NOMEM,
                                  "reflection index: no memory");
            goto fail;
        }
        ix->files = nf;
        memset(&nf[ix->n_files], 0, sizeof *nf);
        nf[ix->n_files].bytes = f.data;
        nf[ix->n_files].len = f.len;
        ix->n_files++;
        st = index_file(ix, (int)ix->n_files - 1);
        if (st != CINFER_OK)
            goto fail;
    }
    if (r != 0) {
        st = bad_set("FileDescriptorSet");
        goto fail;
    }
    if (ix->n_syms)
        qsort(ix->syms, ix->n_syms, sizeof *ix->syms, cmp_sym);
    *out = ix;
    return CINFER_OK;
fail:
    cinfer_refl_index_destroy(ix);
    return st;
}

void cinfer_refl_index_destroy(cinfer_refl_index *ix)
{
    if (!ix)
        return;
    for (size_t i = 0; i < ix->n_files; i++) {
        free(ix->files[i].name);
        for (size_t k = 0; k < ix->files[i].n_deps; k++)
            free(ix->files[i].deps[k]);
        free(ix->files[i].deps);
    }
    free(ix->files);
    for (size_t i = 0; i < ix->n_syms; i++)
        free(ix->syms[i].name);
    free(ix->syms);
    for (size_t i = 0; i < ix->n_services; i++)
        free(ix->services[i]);
    free(ix->services);
    free(ix);
}

size_t cinfer_refl_index_n_services(const cinfer_refl_index *ix)
{
    return ix->n_services;
}

const char *cinfer_refl_index_service(const cinfer_refl_index *ix, size_t i)
{
    return i < ix->n_services ? ix->services[i] : NULL;
}

int cinfer_refl_index_find_symbol(const cinfer_refl_index *ix,
                                  const char *symbol)
{
    if (ix->n_syms == 0)
        return -1;
    refl_symbol key = {(char *)symbol, 0};
    const refl_symbol *s =
        bsearch(&key, ix->syms, ix->n_syms, sizeof *ix->syms, cmp_sym);
    return s ? s->file : -1;
}

static int find_file(const cinfer_refl_index *ix, const char *name)
{
    for (size_t i = 0; i < ix->n_files; i++)
        if (strcmp(ix->files[i].name, name) == 0)
            return (int)i;
    return -1;
}

/* ---------------------------------------------------------------------- */
/* Answers                                                                */
/* ---------------------------------------------------------------------- */

/* Marks file fi and its transitive dependencies in `order` (the file first,
 * then dependencies depth-first, each once). Dependencies missing from the
 * set are skipped: the client then reports them, which is the honest
 * answer. */
static void collect_files(const cinfer_refl_index *ix, int fi, char *seen,
                          int *order, size_t *n, int depth)
{
    if (seen[fi] || depth > 64)
        return;
    seen[fi] = 1;
    order[(*n)++] = fi;
    for (size_t k = 0; k < ix->files[fi].n_deps; k++) {
        int d = find_file(ix, ix->files[fi].deps[k]);
        if (d >= 0)
            collect_files(ix, d, seen, order, n, depth + 1);
    }
}

cinfer_status cinfer_refl_answer(const cinfer_refl_index *ix,
                                 const uint8_t *req, size_t req_len,
                                 uint8_t **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    Grpc__Reflection__V1__ServerReflectionRequest *rq =
        grpc__reflection__v1__server_reflection_request__unpack(NULL, req_len,
                                                                req);
    if (!rq)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "ServerReflectionRequest does not decode");

    Grpc__Reflection__V1__ServerReflectionResponse resp =
        GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__INIT;
    Grpc__Reflection__V1__FileDescriptorResponse fdr =
        GRPC__REFLECTION__V1__FILE_DESCRIPTOR_RESPONSE__INIT;
    Grpc__Reflection__V1__ListServiceResponse lsr =
        GRPC__REFLECTION__V1__LIST_SERVICE_RESPONSE__INIT;
    Grpc__Reflection__V1__ExtensionNumberResponse enr =
        GRPC__REFLECTION__V1__EXTENSION_NUMBER_RESPONSE__INIT;
    Grpc__Reflection__V1__ErrorResponse err =
        GRPC__REFLECTION__V1__ERROR_RESPONSE__INIT;
    Grpc__Reflection__V1__ServiceResponse *svc = NULL;
    Grpc__Reflection__V1__ServiceResponse **svcp = NULL;
    ProtobufCBinaryData *blobs = NULL;
    char *seen = NULL;
    int *order = NULL;
    char msg[320];
    cinfer_status st = CINFER_OK;

    /* The echo is a fresh copy of the known fields: protobuf-c would
     * re-emit unknown ones verbatim, including ones no parser accepts
     * (field number 0). */
    Grpc__Reflection__V1__ServerReflectionRequest echo =
        GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__INIT;
    Grpc__Reflection__V1__ExtensionRequest echo_ext =
        GRPC__REFLECTION__V1__EXTENSION_REQUEST__INIT;
    echo.host = rq->host;
    echo.message_request_case = rq->message_request_case;
    switch (rq->message_request_case) {
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_EXTENSION:
        if (rq->file_containing_extension) {
            echo_ext.containing_type =
                rq->file_containing_extension->containing_type;
            echo_ext.extension_number =
                rq->file_containing_extension->extension_number;
        }
        echo.file_containing_extension = &echo_ext;
        break;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME:
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL:
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_ALL_EXTENSION_NUMBERS_OF_TYPE:
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES:
        echo.list_services = rq->list_services; /* the union's string */
        break;
    default:
        echo.message_request_case =
            GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST__NOT_SET;
        break;
    }
    resp.valid_host = rq->host;
    resp.original_request = &echo;

    int file = -1;
    const char *what = NULL;
    switch (rq->message_request_case) {
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES:
        svc = calloc(ix->n_services ? ix->n_services : 1, sizeof *svc);
        svcp = calloc(ix->n_services ? ix->n_services : 1, sizeof *svcp);
        if (!svc || !svcp)
            goto nomem;
        for (size_t i = 0; i < ix->n_services; i++) {
            grpc__reflection__v1__service_response__init(&svc[i]);
            svc[i].name = ix->services[i];
            svcp[i] = &svc[i];
        }
        lsr.n_service = ix->n_services;
        lsr.service = svcp;
        resp.message_response_case =
            GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_LIST_SERVICES_RESPONSE;
        resp.list_services_response = &lsr;
        break;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME:
        what = rq->file_by_filename;
        file = find_file(ix, what);
        break;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL:
        what = rq->file_containing_symbol;
        file = cinfer_refl_index_find_symbol(ix, what);
        break;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_EXTENSION:
        what = rq->file_containing_extension &&
                       rq->file_containing_extension->containing_type
                   ? rq->file_containing_extension->containing_type
                   : "";
        /* No file declares extensions. */
        snprintf(msg, sizeof msg, "no extension %d of %.200s",
                 rq->file_containing_extension
                     ? (int)rq->file_containing_extension->extension_number
                     : 0,
                 what);
        what = NULL;
        goto not_found;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_ALL_EXTENSION_NUMBERS_OF_TYPE:
        if (cinfer_refl_index_find_symbol(ix,
                                          rq->all_extension_numbers_of_type) <
            0) {
            snprintf(msg, sizeof msg, "type not found: %.200s",
                     rq->all_extension_numbers_of_type);
            goto not_found;
        }
        enr.base_type_name = rq->all_extension_numbers_of_type;
        resp.message_response_case =
            GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ALL_EXTENSION_NUMBERS_RESPONSE;
        resp.all_extension_numbers_response = &enr;
        break;
    default:
        err.error_code = 12; /* UNIMPLEMENTED */
        err.error_message = "message_request not set or not supported";
        resp.message_response_case =
            GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;
        resp.error_response = &err;
        break;
    }

    if (what) {
        if (file < 0) {
            snprintf(msg, sizeof msg, "%s not found: %.200s",
                     rq->message_request_case ==
                             GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME
                         ? "file"
                         : "symbol",
                     what);
            goto not_found;
        }
        seen = calloc(ix->n_files, 1);
        order = calloc(ix->n_files, sizeof *order);
        blobs = calloc(ix->n_files, sizeof *blobs);
        if (!seen || !order || !blobs)
            goto nomem;
        size_t n = 0;
        collect_files(ix, file, seen, order, &n, 0);
        for (size_t i = 0; i < n; i++) {
            blobs[i].data = (uint8_t *)ix->files[order[i]].bytes;
            blobs[i].len = ix->files[order[i]].len;
        }
        fdr.n_file_descriptor_proto = n;
        fdr.file_descriptor_proto = blobs;
        resp.message_response_case =
            GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE;
        resp.file_descriptor_response = &fdr;
    }
    goto pack;

not_found:
    err.error_code = 5; /* NOT_FOUND */
    err.error_message = msg;
    resp.message_response_case =
        GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;
    resp.error_response = &err;

pack:;
    size_t n = grpc__reflection__v1__server_reflection_response__get_packed_size(
        &resp);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        goto nomem;
    grpc__reflection__v1__server_reflection_response__pack(&resp, buf);
    *out = buf;
    *out_len = n;
    goto done;
nomem:
    st = cinfer_set_error(CINFER_E_NOMEM, "reflection: no memory");
done:
    free(svc);
    free(svcp);
    free(blobs);
    free(seen);
    free(order);
    grpc__reflection__v1__server_reflection_request__free_unpacked(rq, NULL);
    return st;
}
