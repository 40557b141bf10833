/* The replay driver of a fuzz target built without libFuzzer: each
 * regular file named, and each regular file of each directory named (in
 * name order, not recursing), goes once through LLVMFuzzerTestOneInput.
 * Prints TAP, one test per input; a failed check in the target aborts,
 * which leaves the rest of the plan unreported (tests/run.sh counts it
 * as failed) after a "# input: PATH" line naming the culprit.
 *   fuzz-<target> FILE|DIR...
 * No arguments, or nothing to replay, is an error: a corpus that went
 * missing must not pass. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

struct list {
	char **v;
	size_t n, cap;
};

static void add(struct list *l, char *path)
{
	if (l->n == l->cap) {
		l->cap = l->cap ? 2 * l->cap : 64;
		l->v = xrealloc(l->v, l->cap * sizeof(char *));
	}
	l->v[l->n++] = path;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The regular files of arg (itself, or those in it); -errno. */
static int collect(const char *arg, struct list *l)
{
	struct stat st;
	if (stat(arg, &st) < 0)
		return -errno;
	if (!S_ISDIR(st.st_mode)) {
		add(l, xstrdup(arg));
		return 0;
	}
	DIR *d = opendir(arg);
	if (!d)
		return -errno;
	size_t from = l->n;
	struct dirent *e;
	while ((e = readdir(d))) {
		char *p = xasprintf("%s/%s", arg, e->d_name);
		if (e->d_name[0] != '.' && stat(p, &st) == 0 && S_ISREG(st.st_mode))
			add(l, p);
		else
			free(p);
	}
	closedir(d);
	qsort(l->v + from, l->n - from, sizeof(char *), by_name);
	return 0;
}

static int read_file(const char *path, uint8_t **data, size_t *size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	*size = (size_t)st.st_size;
	*data = xmalloc(*size + 1);	/* never a zero-size allocation */
	ssize_t k = *size ? read(fd, *data, *size) : 0;
	close(fd);
	if (k != (ssize_t)*size) {
		free(*data);
		return k < 0 ? -errno : -EIO;
	}
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (LLVMFuzzerInitialize)
		LLVMFuzzerInitialize(&argc, &argv);
	struct list l = { 0 };
	for (int i = 1; i < argc; i++) {
		int r = collect(argv[i], &l);
		if (r < 0) {
			printf("1..1\nnot ok 1 - %s: %s\n", argv[i], strerror(-r));
			return 1;
		}
	}
	if (l.n == 0) {
		printf("1..1\nnot ok 1 - nothing to replay: give the corpus files or directories\n");
		return 1;
	}
	printf("1..%zu\n", l.n);
	int bad = 0;
	for (size_t i = 0; i < l.n; i++) {
		uint8_t *data = NULL;
		size_t size = 0;
		int r = read_file(l.v[i], &data, &size);
		if (r < 0) {
			printf("not ok %zu - %s: %s\n", i + 1, l.v[i], strerror(-r));
			bad = 1;
		} else {
			printf("# input: %s\n", l.v[i]);
			LLVMFuzzerTestOneInput(data, size);
			free(data);
			printf("ok %zu - %s (%zu bytes)\n", i + 1, l.v[i], size);
		}
		free(l.v[i]);
	}
	free(l.v);
	return bad;
}
