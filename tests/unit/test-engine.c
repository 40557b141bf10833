/* Unit tests of the engine table (src/engine/engine.c): engines chosen
 * by name or $CAPSULE_ENGINE, an unknown name refused with the list, and
 * QEMU's end_leftover on a directory whose VM is gone. No VM starts. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "engine.h"
#include "jail-internal.h"
#include "paths.h"
#include "util.h"

static void get_by_name_and_default(void **state)
{
	(void)state;
	const struct cap_engine_ops *e = NULL, *d = NULL;
	struct cap_err err = { 0 };
	unsetenv("CAPSULE_ENGINE");
	assert_int_equal(cap_engine_get("qemu", &e, &err), 0);
	assert_string_equal(cap_engine_name(e), "qemu");
	assert_int_equal(cap_engine_get(NULL, &d, &err), 0);
	assert_ptr_equal(d, e);	/* the default */
	setenv("CAPSULE_ENGINE", "qemu", 1);
	assert_int_equal(cap_engine_get(NULL, &d, &err), 0);
	assert_ptr_equal(d, e);
	unsetenv("CAPSULE_ENGINE");
}

static void unknown_is_refused_with_the_list(void **state)
{
	(void)state;
	const struct cap_engine_ops *e = NULL;
	struct cap_err err = { 0 };
	assert_int_equal(cap_engine_get("firecracker", &e, &err), -ENOENT);
	assert_null(e);	/* *out written only on success */
	assert_non_null(strstr(err.msg, "\"firecracker\""));
	assert_non_null(strstr(err.msg, "the engines are: qemu"));
	setenv("CAPSULE_ENGINE", "nope", 1);
	err = (struct cap_err){ 0 };
	assert_int_equal(cap_engine_get(NULL, &e, &err), -ENOENT);
	assert_non_null(strstr(err.msg, "CAPSULE_ENGINE"));
	unsetenv("CAPSULE_ENGINE");
}

/* The identity names the engine, so templates never cross engines. */
static void identity_names_the_engine(void **state)
{
	(void)state;
	const struct cap_engine_ops *e;
	assert_int_equal(cap_engine_get("qemu", &e, NULL), 0);
	char *id = cap_engine_identity(e, CAP_ACCEL_KVM);
	assert_true(strncmp(id, "qemu=", 5) == 0);
	free(id);
}

/* A leftover whose process is gone (or is not that VM's: this test's own
 * pid) is not killed; the sockets it left are removed, nothing else. */
static void end_leftover_spares_other_processes(void **state)
{
	(void)state;
	const struct cap_engine_ops *e;
	assert_int_equal(cap_engine_get("qemu", &e, NULL), 0);
	char dir[] = "/tmp/test-engine.XXXXXX";
	assert_non_null(mkdtemp(dir));
	const char *files[] = { "qmp.sock", "agent.sock", "console.log" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(files); i++) {
		char *p = xasprintf("%s/%s", dir, files[i]);
		assert_int_equal(cap_write_file_atomic(p, "x", 1, 0600), 0);
		free(p);
	}
	assert_int_equal(cap_engine_end_leftover(e, dir, getpid()), 0);
	assert_int_equal(cap_engine_end_leftover(e, dir, 0), 0);
	char *p = xasprintf("%s/qmp.sock", dir);
	assert_int_not_equal(access(p, F_OK), 0);
	free(p);
	p = xasprintf("%s/agent.sock", dir);
	assert_int_not_equal(access(p, F_OK), 0);
	free(p);
	p = xasprintf("%s/console.log", dir);
	assert_int_equal(access(p, F_OK), 0);
	free(p);
	assert_int_equal(cap_remove_tree(dir), 0);
}

/* A process that looks like the VM of dir (QEMU's name, -name
 * guest=<dir>) is killed and reported; one of another directory is not. */
static pid_t fake_vm(const char *dir)
{
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		char *guest = xasprintf("guest=%s", dir);
		char *argv[] = { "/usr/bin/qemu-system-x86_64", "-c", "while :; do sleep 1; done", "-name", guest, NULL };
		execv("/bin/sh", argv);
		_exit(127);
	}
	/* Until it runs sh (its cmdline is QEMU's name). */
	char *path = xasprintf("/proc/%d/cmdline", (int)pid);
	for (int i = 0; i < 200; i++) {
		char *s = NULL;
		ssize_t n = cap_read_file(path, 4096, &s);
		bool ready = n > 0 && strstr(s, "qemu-system-x86_64");
		free(s);
		if (ready)
			break;
		usleep(5000);
	}
	free(path);
	return pid;
}

static void end_leftover_kills_the_vm_of_that_directory(void **state)
{
	(void)state;
	const struct cap_engine_ops *e;
	assert_int_equal(cap_engine_get("qemu", &e, NULL), 0);
	char dir[] = "/tmp/test-engine.XXXXXX";
	assert_non_null(mkdtemp(dir));
	pid_t pid = fake_vm(dir);
	int status;
	/* Another directory's VM is left alone. */
	assert_int_equal(cap_engine_end_leftover(e, "/tmp/elsewhere", pid), 0);
	assert_int_equal(waitpid(pid, &status, WNOHANG), 0);
	assert_int_equal(cap_engine_end_leftover(e, dir, pid), 1);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	assert_int_equal(cap_remove_tree(dir), 0);
}

/* The copier (as root) opens the jail's copy, /mem/ram below the
 * program's root, whose folder the jailed program owns: a link planted
 * at any level, another file type, another owner or a hard link are
 * refused; a temporary directory stands in for the root. */
static void jail_copy_is_opened_without_links(void **state)
{
	(void)state;
	char dir[] = "/tmp/test-engine-jail.XXXXXX";
	assert_non_null(mkdtemp(dir));
	char *mem = xasprintf("%s/mem", dir), *ram = xasprintf("%s/mem/ram", dir);
	char *target = xasprintf("%s/target", dir), *other = xasprintf("%s/other", dir);
	assert_int_equal(mkdir(mem, 0700), 0);
	int t = open(target, O_WRONLY | O_CREAT | O_EXCL, 0600);
	assert_true(t >= 0);
	close(t);
	int root = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	assert_true(root >= 0);
	uid_t me = geteuid();

	/* The file itself a link (to a host file): refused, target untouched. */
	assert_int_equal(symlink(target, ram), 0);
	assert_int_equal(jail_root_open_copy(root, "/mem/ram", me), -ELOOP);
	unlink(ram);
	/* The folder a link (to one holding a file of that name). */
	assert_int_equal(mkdir(other, 0700), 0);
	char *oram = xasprintf("%s/ram", other);
	t = open(oram, O_WRONLY | O_CREAT | O_EXCL, 0600);
	assert_true(t >= 0);
	close(t);
	assert_int_equal(rmdir(mem), 0);
	assert_int_equal(symlink(other, mem), 0);
	int r = jail_root_open_copy(root, "/mem/ram", me);
	assert_true(r == -ENOTDIR || r == -ELOOP);
	unlink(mem);
	assert_int_equal(mkdir(mem, 0700), 0);
	/* A FIFO (opened without blocking, refused), a directory. */
	assert_int_equal(mkfifo(ram, 0600), 0);
	r = jail_root_open_copy(root, "/mem/ram", me);
	assert_true(r == -ENXIO || r == -EINVAL);
	unlink(ram);
	assert_int_equal(mkdir(ram, 0700), 0);
	assert_true(jail_root_open_copy(root, "/mem/ram", me) < 0);
	rmdir(ram);
	/* A hard link to another file, another owner. */
	assert_int_equal(link(target, ram), 0);
	assert_int_equal(jail_root_open_copy(root, "/mem/ram", me), -EPERM);
	unlink(ram);
	t = open(ram, O_WRONLY | O_CREAT | O_EXCL, 0600);
	assert_true(t >= 0);
	close(t);
	assert_int_equal(jail_root_open_copy(root, "/mem/ram", me + 1), -EPERM);
	assert_int_equal(jail_root_open_copy(root, "/mem/../target", me), -EINVAL);
	assert_int_equal(jail_root_open_copy(root, "", me), -EINVAL);
	/* The real thing: a regular file of its owner, open for writing. */
	int fd = jail_root_open_copy(root, "/mem/ram", me);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "x", 1), 1);
	close(fd);
	struct stat st;
	assert_int_equal(stat(target, &st), 0);
	assert_int_equal(st.st_size, 0);
	close(root);
	assert_int_equal(cap_remove_tree(dir), 0);
	free(oram);
	free(mem);
	free(ram);
	free(target);
	free(other);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(get_by_name_and_default),
		cmocka_unit_test(unknown_is_refused_with_the_list),
		cmocka_unit_test(identity_names_the_engine),
		cmocka_unit_test(end_leftover_spares_other_processes),
		cmocka_unit_test(end_leftover_kills_the_vm_of_that_directory),
		cmocka_unit_test(jail_copy_is_opened_without_links),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
