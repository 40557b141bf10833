/* Fuzz target for the protocol decoder: the host-side client fed arbitrary
 * guest bytes (after a valid HELLO, with a few open streams), the exec
 * (with its container section), SETUP, LISTENERS, FILE, UPDATE, STATS
 * and stats-record decoders fed arbitrary payloads, and the
 * guest's tar reader (src/proto/tar.c) fed arbitrary streams.
 *
 * Built three ways (tests/fuzz/meson.build): as a libFuzzer target
 * fuzz-proto in a -Dfuzzing=true clang tree, as fuzz-proto replaying
 * the files given (replay.c) elsewhere, and with -DCAP_FUZZ_MUTATE as
 * mutate-proto [ITERATIONS], a standalone driver that runs seeded random
 * mutations of valid frames under ASan+UBSan in `make test`. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client.h"
#include "tar.h"
#include "util.h"

static void on_output(void *ud, uint32_t id, int fd, const uint8_t *p, size_t n)
{
	(void)ud, (void)id, (void)fd;
	volatile uint8_t sink = 0;
	for (size_t i = 0; i < n; i++)
		sink ^= p[i];
	(void)sink;
}

static void on_done(void *ud, uint32_t id, const struct cap_exit *ex, int e, const char *m)
{
	(void)ud, (void)id, (void)ex, (void)e;
	if (m)
		(void)strlen(m);
}

static const struct cap_exec_events ev = { on_output, on_done, NULL };

/* The tar reader over data (through a memfd, as it reads an fd): every
 * entry and all its data, until the end or an error. */
static void fuzz_tar(const uint8_t *data, size_t size)
{
	static int fd = -1;
	if (fd < 0 && (fd = memfd_create("fuzz-tar", MFD_CLOEXEC)) < 0)
		abort();
	if (ftruncate(fd, 0) < 0 || pwrite(fd, data, size, 0) != (ssize_t)size ||
	    lseek(fd, 0, SEEK_SET) != 0)
		abort();
	struct cap_tar_reader r;
	struct cap_tar_entry e;
	struct cap_err err;
	uint8_t buf[4096];
	cap_tar_reader_init(&r, fd);
	int k;
	while ((k = cap_tar_next(&r, &e, &err)) == 1) {
		size_t plen = strlen(e.path);
		if (plen == 0 || plen > CAP_TAR_PATH_MAX || strlen(e.linkname) > CAP_TAR_PATH_MAX ||
		    (e.type == CAP_TAR_SYMLINK && !*e.linkname) || e.mode > 07777 ||
		    e.size > (uint64_t)INT64_MAX || ((e.type == CAP_TAR_DIR || e.type == CAP_TAR_SYMLINK) && e.size))
			abort();
		ssize_t m;
		while ((m = cap_tar_read(&r, buf, sizeof(buf), &err)) > 0)
			;
		if (m < 0)
			break;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct cap_client c;
	struct cap_buf hello;
	char *argv[] = { "true", NULL };
	struct cap_exec_req req = { .argv = argv, .argc = 1, .output_cap = 100 };
	uint32_t id;

	cap_client_init(&c);
	cap_buf_init(&hello);
	cap_proto_hello_encode(&hello, "fuzz");
	cap_client_feed(&c, cap_buf_head(&hello), cap_buf_used(&hello), NULL);
	for (int i = 0; i < 3; i++)
		cap_client_exec(&c, &req, &ev, NULL, &id, NULL);
	/* Split the input in two feeds to exercise partial frames. */
	size_t half = size / 2;
	struct cap_err err;
	if (cap_client_feed(&c, data, half, &err) == 0)
		cap_client_feed(&c, data + half, size - half, &err);
	cap_client_fini(&c);
	cap_buf_fini(&hello);

	struct cap_exec_req out;
	if (cap_proto_exec_decode(data, size, &out, &err) == 0)
		cap_exec_req_fini(&out);

	struct cap_setup setup;
	if (cap_proto_setup_decode(data, size, &setup) == 0) {
		if (setup.net_prefix > 32 || setup.hostname == NULL ||
		    setup.envc > CAP_SETUP_MAX_ENV || (setup.ca_pem && !*setup.ca_pem) ||
		    !setup.workspace || (*setup.workspace && !cap_proto_valid_name(setup.workspace)))
			abort();
		for (uint32_t i = 0; i < setup.envc; i++)
			if (!strchr(setup.env[i], '=') || setup.env[i][0] == '=')
				abort();
		if (setup.net_static && !cap_proto_setup_static_ok(&setup))
			abort();
		/* What the decoder accepts, the encoder takes back unchanged. */
		struct cap_buf again;
		cap_buf_init(&again);
		if (cap_proto_setup_encode(&again, &setup) < 0 ||
		    cap_buf_used(&again) != CAP_PROTO_HEADER + size ||
		    memcmp(cap_buf_head(&again) + CAP_PROTO_HEADER, data, size) != 0)
			abort();
		cap_buf_fini(&again);
		cap_setup_fini(&setup);
	}

	struct cap_file_req file;
	char root[32], path[4100];
	if (cap_proto_file_decode(data, size, &file, root, sizeof(root), path, sizeof(path)) == 0) {
		/* What the decoder accepts, the encoder takes back unchanged. */
		struct cap_buf again;
		cap_buf_init(&again);
		if (!cap_proto_file_path_ok(file.path) || cap_proto_file_encode(&again, 1, &file) < 0 ||
		    cap_buf_used(&again) != CAP_PROTO_HEADER + size ||
		    memcmp(cap_buf_head(&again) + CAP_PROTO_HEADER, data, size) != 0)
			abort();
		cap_buf_fini(&again);
	}

	/* A pod's containers: UPDATE, STATS and the stats record. */
	struct cap_update upd;
	if (cap_proto_update_decode(data, size, &upd) == 0) {
		struct cap_buf again;
		cap_buf_init(&again);
		if (!cap_proto_ctr_name_ok(upd.name) || !cap_proto_limits_ok(&upd.limits) ||
		    cap_proto_update_encode(&again, 1, &upd) < 0 || cap_buf_used(&again) != CAP_PROTO_HEADER + size ||
		    memcmp(cap_buf_head(&again) + CAP_PROTO_HEADER, data, size) != 0)
			abort();
		cap_buf_fini(&again);
	}
	char cname[CAP_CTR_NAME_MAX + 1];
	if (cap_proto_stats_req_decode(data, size, cname, sizeof(cname)) == 0) {
		struct cap_buf again;
		cap_buf_init(&again);
		if (cap_proto_stats_req_encode(&again, 1, cname) < 0 || cap_buf_used(&again) != CAP_PROTO_HEADER + size ||
		    memcmp(cap_buf_head(&again) + CAP_PROTO_HEADER, data, size) != 0)
			abort();
		cap_buf_fini(&again);
	}
	static struct cap_stats stats;
	if (cap_proto_stats_decode(data, size, &stats) == 0) {
		struct cap_buf again;
		cap_buf_init(&again);
		cap_proto_stats_encode(&again, &stats);
		if (stats.n > CAP_STATS_MAX || cap_buf_used(&again) != size || memcmp(cap_buf_head(&again), data, size) != 0)
			abort();
		cap_buf_fini(&again);
	}

	/* Shorter than a header is one case, checked by test-tar. */
	if (size >= CAP_TAR_BLOCK)
		fuzz_tar(data, size);

	uint16_t *ports;
	uint32_t n;
	if (cap_proto_listeners_decode(data, size, &ports, &n) == 0) {
		/* What the decoder accepts, the encoder takes back unchanged. */
		struct cap_buf again;
		cap_buf_init(&again);
		if (n > CAP_PROTO_MAX_LISTENERS || cap_proto_listeners_encode(&again, ports, n) < 0 ||
		    cap_buf_used(&again) != CAP_PROTO_HEADER + size ||
		    memcmp(cap_buf_head(&again) + CAP_PROTO_HEADER, data, size) != 0)
			abort();
		cap_buf_fini(&again);
		free(ports);
	}

	/* A PortForward's CONNECT: what the decoder accepts, the encoder
	 * takes back unchanged. */
	uint16_t port;
	if (cap_proto_connect_decode(data, size, &port) == 0) {
		struct cap_buf again;
		cap_buf_init(&again);
		cap_proto_connect_encode(&again, 1, port);
		if (port == 0 || cap_buf_used(&again) != CAP_PROTO_HEADER + size ||
		    memcmp(cap_buf_head(&again) + CAP_PROTO_HEADER, data, size) != 0)
			abort();
		cap_buf_fini(&again);
	}
	return 0;
}

#ifdef CAP_FUZZ_MUTATE
/* Standalone driver: mutate valid seed frames with a fixed seed. */
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)rng;
}

/* Mutate buf[0..len) in place, 1 to 8 times; returns the new length (>= 1). */
static size_t mutate(uint8_t *buf, size_t len)
{
	int muts = 1 + (int)(next() % 8);
	for (int m = 0; m < muts; m++) {
		switch (next() % 4) {
		case 0: buf[next() % len] = (uint8_t)next(); break;
		case 1: buf[next() % len] ^= (uint8_t)(1u << (next() % 8)); break;
		case 2: len = 1 + next() % len; break;	/* truncate */
		case 3:
			if (len >= 4)
				cap_put_u32(buf + next() % (len - 3), next());
			break;
		}
	}
	return len;
}

static void write_seed(const char *dir, const char *name, const void *p, size_t n)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0)
		abort();
}

int main(int argc, char **argv)
{
	/* mutate-proto --seeds DIR: write the seeds as files (the stream,
	 * each frame's payload, the tar stream), for corpus/proto. */
	const char *seeds = argc > 2 && strcmp(argv[1], "--seeds") == 0 ? argv[2] : NULL;
	long iters = argc > 1 && !seeds ? atol(argv[1]) : 100000;
	struct cap_buf seed;
	cap_buf_init(&seed);
	cap_proto_put(&seed, CAP_MSG_STDOUT, 1, "hello", 5);
	cap_proto_put(&seed, CAP_MSG_STDERR, 2, "err", 3);
	struct cap_exit ex = { .kind = CAP_EXIT_CODE, .value = 1 };
	cap_proto_exit_encode(&seed, 1, &ex);
	cap_proto_error_encode(&seed, 3, 5, "nope");
	char *eargv[] = { "sh", "-c", "echo", NULL };
	char *env[] = { "A=B", NULL };
	struct cap_exec_req req = { .argv = eargv, .argc = 3, .env = env, .envc = 1, .cwd = "/" };
	cap_proto_exec_encode(&seed, 4, &req);
	/* A container's command (CAP_EXEC_USER): the user section, so that
	 * mutations reach its decoder. */
	struct cap_exec_req ureq = { .argv = eargv, .argc = 3, .env = env, .envc = 1, .cwd = "/",
				     .flags = CAP_EXEC_USER, .uid = 0, .gid = 0, .ngroups = 1,
				     .groups = { 10 }, .nrlimits = 1, .umask = 022 };
	ureq.rlimits[0] = (struct cap_exec_rlimit){ .resource = 7, .soft = 1024, .hard = 4096 };
	cap_proto_exec_encode(&seed, 6, &ureq);
	/* A pod's container: the container section after the user section. */
	static struct cap_exec_container ctr = {
		.name = "c1", .options = CAP_CTR_ROOT | CAP_CTR_READONLY,
		.limits = { .set = CAP_LIMIT_ALL, .memory_max = 1 << 26, .cpu_quota = 50000, .cpu_period = 100000,
			    .cpu_weight = 100, .pids_max = 64 },
		.mounts = { { .kind = CAP_CTR_PROC, .destination = "/proc" },
			    { .kind = CAP_CTR_TMPFS, .destination = "/dev", .data = "mode=755", .flags = 2 },
			    { .kind = CAP_CTR_VOLUME, .destination = "/data", .data = "v0123" } },
		.nmounts = 3,
	};
	ureq.flags |= CAP_EXEC_CONTAINER;
	ureq.ctr = &ctr;
	cap_proto_exec_encode(&seed, 7, &ureq);
	struct cap_update upd = { .op = CAP_UPDATE_LIMITS, .name = "c1",
				  .limits = { .set = CAP_LIMIT_MEMORY | CAP_LIMIT_PIDS, .memory_max = 1 << 27,
					      .pids_max = CAP_LIMIT_NONE } };
	cap_proto_update_encode(&seed, 8, &upd);
	cap_proto_stats_req_encode(&seed, 9, "c1");
	cap_proto_stats_req_encode(&seed, 10, "");
	static struct cap_stats st;
	cap_stats_put(&st, "cpu.usage_usec", 1234);
	cap_stats_put(&st, "memory.max", CAP_LIMIT_NONE);
	cap_stats_put(&st, "memory.stat.anon", 4096);
	struct cap_buf rec;
	cap_buf_init(&rec);
	cap_proto_stats_encode(&rec, &st);
	cap_proto_put(&seed, CAP_MSG_STDOUT, 9, cap_buf_head(&rec), cap_buf_used(&rec));
	cap_buf_fini(&rec);
	const uint16_t ports[] = { 22, 80, 8080 };
	cap_proto_listeners_encode(&seed, ports, 3);
	cap_proto_listeners_encode(&seed, NULL, 0);
	struct cap_setup setup = { .root_image = "root", .hostname = "h", .net_addr = 0x0a00020f,
				   .net_gateway = 0x0a000202, .net_dns = 0x0a000203,
				   .net_prefix = 24, .proxy_port = 3128, .auto_publish = true };
	cap_proto_setup_encode(&seed, &setup);
	char *senv[] = { "TOKEN=cap_placeholder_0123", "GIT_TOKEN=x" };
	setup.ca_pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
	setup.env = senv;
	setup.envc = 2;
	cap_proto_setup_encode(&seed, &setup);
	setup.workspace = "capsule-wspace";
	cap_proto_setup_encode(&seed, &setup);
	setup.ca_pem = NULL;
	setup.envc = 0;
	cap_proto_setup_encode(&seed, &setup);	/* an empty secrets section before it */
	struct cap_file_req freq = { .op = CAP_FILE_TAR_OUT, .limit = CAP_TAR_PATHS_STDIN,
				     .root = "/workspace", .path = "src/a b" };
	cap_proto_file_encode(&seed, 5, &freq);
	/* A pod's: the options section's static network (no DNS, no proxy). */
	struct cap_setup pod = { .root_image = "root", .hostname = "pod", .net_addr = 0x0ae14b02,
				 .net_gateway = 0x0ae14b01, .net_prefix = 24, .net_static = true,
				 .net_mac = { 0x16, 0x8d, 0x35, 0x82, 0xb7, 0x3c }, .net_mtu = 1450, .nroutes = 2 };
	pod.routes[0] = (struct cap_setup_route){ .dst = 0x0a000000, .dst_len = 8 };
	pod.routes[1] = (struct cap_setup_route){ .dst = 0xc0a80000, .dst_len = 16, .gateway = 0x0ae14b01 };
	if (cap_proto_setup_encode(&seed, &pod) < 0)
		abort();
	cap_proto_connect_encode(&seed, 11, 8080);

	/* Where each seed frame's payload starts, and its length. */
	struct {
		size_t off, len;
	} frames[32];
	size_t nframes = 0;
	const uint8_t *all = cap_buf_head(&seed);
	size_t n = cap_buf_used(&seed);
	for (size_t off = 0; off < n && nframes < CAP_ARRAY_SIZE(frames);) {
		struct cap_frame f;
		int r = cap_proto_parse(all + off, n - off, &f);
		if (r <= 0)
			abort();
		frames[nframes].off = off + CAP_PROTO_HEADER;
		frames[nframes++].len = f.len;
		off += (size_t)r;
	}

	/* A tar stream: ustar, a pax path, a link, a directory, data. */
	struct cap_buf tar;
	cap_buf_init(&tar);
	char longp[300];
	memset(longp, 'a', sizeof(longp) - 1);
	longp[sizeof(longp) - 1] = '\0';
	struct cap_tar_entry te[] = {
		{ .path = "d", .type = CAP_TAR_DIR, .mode = 0755 },
		{ .path = "d/f", .type = CAP_TAR_FILE, .mode = 0644, .size = 700 },
		{ .path = longp, .type = CAP_TAR_FILE, .mode = 0600, .size = 3 },
		{ .path = "d/l", .type = CAP_TAR_SYMLINK, .mode = 0777, .linkname = longp },
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(te); i++) {
		cap_tar_header(&tar, &te[i]);
		for (uint64_t b = 0; b < te[i].size; b++)
			cap_buf_append(&tar, "x", 1);
		cap_tar_pad(&tar, te[i].size);
	}
	cap_tar_end(&tar);

	if (seeds) {
		write_seed(seeds, "stream", all, n);
		write_seed(seeds, "tar", cap_buf_head(&tar), cap_buf_used(&tar));
		for (size_t k = 0; k < nframes; k++) {
			char name[32];
			snprintf(name, sizeof(name), "payload-%02zu", k);
			write_seed(seeds, name, all + frames[k].off, frames[k].len);
		}
		cap_buf_fini(&seed);
		cap_buf_fini(&tar);
		return 0;
	}
	uint8_t *buf = xmalloc(CAP_MAX(n, cap_buf_used(&tar)) + 64);
	for (long i = 0; i < iters; i++) {
		if (i % 10 == 0) {
			memcpy(buf, cap_buf_head(&tar), cap_buf_used(&tar));
			fuzz_tar(buf, mutate(buf, cap_buf_used(&tar)));
		}
		/* The whole stream of frames through the client. */
		memcpy(buf, all, n);
		LLVMFuzzerTestOneInput(buf, mutate(buf, n));
		/* One frame's payload alone through the payload decoders. */
		size_t k = (size_t)i % nframes;
		memcpy(buf, all + frames[k].off, frames[k].len);
		LLVMFuzzerTestOneInput(buf, frames[k].len ? mutate(buf, frames[k].len) : 0);
	}
	free(buf);
	cap_buf_fini(&seed);
	cap_buf_fini(&tar);
	printf("1..1\nok 1 - %ld mutated inputs through the client and the exec, SETUP, LISTENERS, FILE, UPDATE, STATS and CONNECT decoders and the tar reader without a crash\n", iters);
	return 0;
}
#endif
