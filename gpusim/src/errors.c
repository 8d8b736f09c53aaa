/* cuGetErrorString / cuGetErrorName from the table generated from cuda.h. */
#include "api.h"
#include "errors_table.h"

static const struct {
    int code;
    const char *name, *text;
} errors[] = {
#define SIM_ERROR_ROW(code, name, text) {code, #name, text},
    SIM_CU_ERRORS(SIM_ERROR_ROW)
#undef SIM_ERROR_ROW
};

static int find(CUresult error)
{
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == error)
            return (int)i;
    return -1;
}

SIM_EXPORT CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    int i = find(error);
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    *pStr = i >= 0 ? errors[i].text : NULL;
    return i >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_EXPORT CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    int i = find(error);
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    *pStr = i >= 0 ? errors[i].name : NULL;
    return i >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
