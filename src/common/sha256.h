/* SHA-256 over buffers and files (OpenSSL's EVP underneath). */
#ifndef CAP_SHA256_H
#define CAP_SHA256_H

#include <stddef.h>
#include <stdint.h>

struct cap_sha256 {
	void *owned_ctx;
};

void cap_sha256_init(struct cap_sha256 *h);
void cap_sha256_update(struct cap_sha256 *h, const void *p, size_t n);
/* Finish into 65 bytes of lowercase hex plus NUL; frees the context. */
void cap_sha256_final_hex(struct cap_sha256 *h, char hex[65]);
/* Hash what is left to read of fd into h, adding the bytes read to
 * *size (may be NULL). 0 or -errno. */
int cap_sha256_update_fd(struct cap_sha256 *h, int fd, uint64_t *size);
/* Hash a file's bytes into h. 0 or -errno. */
int cap_sha256_update_file(struct cap_sha256 *h, const char *path);

#endif
