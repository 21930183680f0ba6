/* lsc_dlpack.h: the few DLPack ABI types lscore reads (DLPack >= 1.2, major 1).
 *
 * Design: a framework that implements the DLPack C exchange API puts a
 * PyCapsule named "dlpack_exchange_api" on its tensor type
 * (`__dlpack_c_exchange_api__`); its `dltensor_from_py_object_no_sync` fills a
 * caller-provided DLTensor that borrows the tensor's memory, shape and strides
 * without any allocation.  _ext/_grads.pyx (CPU gradients) and _ext/_walk.pyx
 * (DeviceTable's READ_DLPACK: device tensors) use it to read pointer, device,
 * dtype and layout of many tensors with one C call each.  Only the layout
 * of the structs matters here; the function pointers lscore never calls are
 * kept as opaque pointers so the struct offsets stay right.
 */
#ifndef LSC_DLPACK_H
#define LSC_DLPACK_H

#include <stdint.h>

#define LSC_DL_CPU 1
#define LSC_DL_CUDA 2
/* DLDataTypeCode values lscore maps to its dtype codes */
#define LSC_DL_FLOAT 2
#define LSC_DL_BFLOAT 4
#define LSC_DL_FLOAT8_E4M3FN 10
#define LSC_DL_FLOAT8_E5M2 12

typedef struct { uint32_t major; uint32_t minor; } lsc_dl_version;
typedef struct { int32_t device_type; int32_t device_id; } lsc_dl_device;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } lsc_dl_dtype;

typedef struct {
    void *data;
    lsc_dl_device device;
    int32_t ndim;
    lsc_dl_dtype dtype;
    int64_t *shape;
    int64_t *strides;       /* elements; NULL (before DLPack 1.2) means C-contiguous */
    uint64_t byte_offset;
} lsc_dl_tensor;

typedef int (*lsc_dl_from_pyobject)(void *py_object, lsc_dl_tensor *out);

typedef struct {
    lsc_dl_version version;
    void *prev_api;
} lsc_dl_api_header;

typedef struct {
    lsc_dl_api_header header;
    void *managed_tensor_allocator;
    void *managed_tensor_from_py_object_no_sync;
    void *managed_tensor_to_py_object_no_sync;
    lsc_dl_from_pyobject dltensor_from_py_object_no_sync;   /* may be NULL */
    void *current_work_stream;
} lsc_dl_exchange_api;

#endif /* LSC_DLPACK_H */
