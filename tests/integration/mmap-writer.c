/* A guest program for tests/integration/test-durable.sh: writes TEXT into
 * FILE through a shared mapping only after the file's descriptor is
 * closed and SECONDS have passed, so the write raises no fanotify event
 * of its own (the agent must see it some other way). Static: the guest
 * has only busybox. Usage: mmap-writer FILE SECONDS TEXT; FILE must hold
 * at least strlen(TEXT) bytes. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: mmap-writer FILE SECONDS TEXT\n");
		return 2;
	}
	size_t n = strlen(argv[3]);
	int fd = open(argv[1], O_RDWR);
	if (fd < 0) {
		perror(argv[1]);
		return 1;
	}
	char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	close(fd);
	sleep((unsigned)atoi(argv[2]));
	memcpy(p, argv[3], n);
	return 0;	/* the mapping goes with the process */
}
