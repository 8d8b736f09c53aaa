/* NVML types the simulator needs beyond libvcuda's subset (vcuda/nvml_abi.h):
 * PCI info, topology levels and events. Layouts and values as in nvml.h
 * 12.x/13.x (and nvidia-ml-py's ctypes mirrors of them). Private to gpusim:
 * the shim does not hook these functions. */
#ifndef VCUDA_GPUSIM_NVML_TOPO_ABI_H
#define VCUDA_GPUSIM_NVML_TOPO_ABI_H

#include <vcuda/nvml_abi.h>

#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
#define NVML_NVLINK_MAX_LINKS 18 /* links nvml.h 12.x knows; newer headers say more */

/* nvmlDeviceGetPciInfo_v3 and nvmlDeviceGetNvLinkRemotePciInfo_v2 fill this. */
typedef struct nvmlPciInfo_st {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE]; /* "0000:10:00.0" */
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;    /* device id << 16 | vendor id */
    unsigned int pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE]; /* "00000000:10:00.0" */
} nvmlPciInfo_t;

typedef enum nvmlGpuLevel_enum {
    NVML_TOPOLOGY_INTERNAL = 0,
    NVML_TOPOLOGY_SINGLE = 10,
    NVML_TOPOLOGY_MULTIPLE = 20,
    NVML_TOPOLOGY_HOSTBRIDGE = 30,
    NVML_TOPOLOGY_NODE = 40,
    NVML_TOPOLOGY_SYSTEM = 50
} nvmlGpuTopologyLevel_t;

typedef enum nvmlEnableState_enum {
    NVML_FEATURE_DISABLED = 0,
    NVML_FEATURE_ENABLED = 1
} nvmlEnableState_t;

typedef enum nvmlIntNvLinkDeviceType_enum {
    NVML_NVLINK_DEVICE_TYPE_GPU = 0x00,
    NVML_NVLINK_DEVICE_TYPE_IBMNPU = 0x01,
    NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02,
    NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF
} nvmlIntNvLinkDeviceType_t;

typedef struct nvmlEventSet_st *nvmlEventSet_t;

#define nvmlEventTypeXidCriticalError 0x0000000000000008ULL

/* nvmlEventSetWait_v2 fills all of it; the legacy nvmlEventSetWait only the
 * first three fields (its struct predates the instance ids). */
typedef struct nvmlEventData_st {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData; /* the XID for nvmlEventTypeXidCriticalError */
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

#endif /* VCUDA_GPUSIM_NVML_TOPO_ABI_H */
