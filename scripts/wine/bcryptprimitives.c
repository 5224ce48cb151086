/* A stand-in for Windows' bcryptprimitives.dll, for running parakeet.exe under Wine 8 only
 * (scripts/ci_windows.sh): Rust's standard library takes its random bytes (HashMap seeds)
 * from ProcessPrng there, which Windows 10 and later have and Wine 8 lacks. Never shipped.
 * It fills the buffer from RtlGenRandom (advapi32's SystemFunction036), which Wine has. */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len)
{
    while (len > 0) {
        ULONG n = len > 0x40000000 ? 0x40000000 : (ULONG)len;
        if (!SystemFunction036(data, n))
            return FALSE;
        data += n;
        len -= n;
    }
    return TRUE;
}
