/* The exported dlsym.
 *
 * glibc resolves dlsym(RTLD_NEXT, name) relative to the object that called
 * dlsym, found from the return address. A C override that calls the real
 * dlsym would make that object libvcuda, so another interposer preloaded after
 * us would find itself again and recurse. The trampoline therefore jumps
 * (never calls) to glibc for RTLD_NEXT, keeping the application's return
 * address, and sends every other handle to vcuda_dlsym_impl. */
#include "real_driver.h"

#if defined(__x86_64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, @function\n"
        "dlsym:\n"
        "    cmpq $-1, %rdi\n"
        "    jne 1f\n"
        "    movq vcuda_real_dlsym(%rip), %rax\n"
        "    testq %rax, %rax\n"
        "    je 1f\n"
        "    jmp *%rax\n"
        "1:  jmp vcuda_dlsym_impl\n"
        ".size dlsym, .-dlsym\n");
#elif defined(__aarch64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, %function\n"
        "dlsym:\n"
        "    cmn x0, #1\n"
        "    b.ne 1f\n"
        "    adrp x16, vcuda_real_dlsym\n"
        "    ldr x16, [x16, :lo12:vcuda_real_dlsym]\n"
        "    cbz x16, 1f\n"
        "    br x16\n"
        "1:  b vcuda_dlsym_impl\n"
        ".size dlsym, .-dlsym\n");
#else
#error "dlsym trampoline: add this architecture"
#endif
