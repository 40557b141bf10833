/* netd: the policy process's system calls, once it is set up (netd.h,
 * cap_netd_config.seccomp): a classic-BPF allowlist of what its loop
 * uses — poll, reads and writes on its sockets, accepting, dialing and
 * listening on IPv4 sockets, memory, the clock, randomness for TLS —
 * and nothing else. Anything else ends the process (SIGSYS): no exec,
 * no ptrace, no opening of files, no new kind of socket, no executable
 * memory. Its network then fails closed, as when it is killed. */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>

#include "netd-int.h"
#include "util.h"

/* The filter names x86_64's calls; on another architecture there is
 * none (netd_seccomp: -ENOTSUP). */
#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#define X32_BIT 0x40000000u	/* x32 calls on x86_64: refused */

/* Allowed whatever their arguments: what its thread was seen to call
 * (strace -ff of tests/unit/test-netd, whose interception cases run
 * under this filter), and what the network and secret suites need (they
 * pass whole under it). */
static const int allowed[] = {
	/* the loop, its sockets, the log */
	SYS_poll, SYS_ppoll, SYS_read, SYS_write, SYS_close, SYS_recvfrom, SYS_recvmsg, SYS_sendto,
	SYS_accept4, SYS_connect, SYS_bind, SYS_listen, SYS_shutdown, SYS_setsockopt,
	SYS_getsockopt, SYS_getsockname, SYS_fcntl, SYS_fstat, SYS_newfstatat,
	/* memory (mmap and mprotect: below, never executable) */
	SYS_brk, SYS_munmap, SYS_mremap, SYS_madvise,
	/* the clock, randomness (TLS keys, DNS IDs; OpenSSL's getpid checks),
	 * locks (contended only where netd shares its process: the tests) */
	SYS_clock_gettime, SYS_gettimeofday, SYS_time, SYS_getrandom, SYS_getpid, SYS_futex,
	/* signals and the end (sigaltstack, rt_sigprocmask, exit: a thread's
	 * end, under a sanitizer too) */
	SYS_rt_sigreturn, SYS_rt_sigprocmask, SYS_sigaltstack, SYS_restart_syscall, SYS_exit,
	SYS_exit_group,
};

#define STMT(code, k) ((struct sock_filter)BPF_STMT(code, k))
#define JUMP(code, k, t, f) ((struct sock_filter)BPF_JUMP(code, k, t, f))
#define ARG_LO(i) (offsetof(struct seccomp_data, args) + (i) * sizeof(uint64_t))
#define FILTER_MAX 128

/* The program: into f (FILTER_MAX entries), its length. */
static unsigned build(struct sock_filter *f)
{
	unsigned n = 0;

	f[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
	f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0);
	f[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
	f[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
	f[n++] = JUMP(BPF_JMP | BPF_JGE | BPF_K, X32_BIT, 0, 1);
	f[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
	for (size_t i = 0; i < CAP_ARRAY_SIZE(allowed); i++) {
		f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)allowed[i], 0, 1);
		f[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
	}
	/* socket(AF_INET, ...) only: dialing out and listening on a
	 * published port (the domain is an int: the low word is all). */
	f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_socket, 0, 4);
	f[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(0));
	f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_INET, 0, 1);
	f[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
	f[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
	/* mmap and mprotect without PROT_EXEC (the protection is an int). */
	f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mmap, 1, 0);
	f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mprotect, 0, 4);
	f[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(2));
	f[n++] = JUMP(BPF_JMP | BPF_JSET | BPF_K, PROT_EXEC, 1, 0);
	f[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
	f[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
	/* Everything else. */
	f[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
	CAP_BUG_ON(n > FILTER_MAX);
	return n;
}

int netd_seccomp(void)
{
	struct sock_filter f[FILTER_MAX];
	struct sock_fprog prog = { .len = (unsigned short)build(f), .filter = f };
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		return -errno;
	if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) < 0)
		return -errno;
	return 0;
}

#else

int netd_seccomp(void)
{
	return -ENOTSUP;
}

#endif
