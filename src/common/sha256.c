#include "sha256.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <unistd.h>

#include "util.h"

void cap_sha256_init(struct cap_sha256 *h)
{
	EVP_MD_CTX *c = EVP_MD_CTX_new();
	CAP_BUG_ON(!c || EVP_DigestInit_ex(c, EVP_sha256(), NULL) != 1);
	h->owned_ctx = c;
}

void cap_sha256_update(struct cap_sha256 *h, const void *p, size_t n)
{
	CAP_BUG_ON(EVP_DigestUpdate(h->owned_ctx, p, n) != 1);
}

void cap_sha256_final_hex(struct cap_sha256 *h, char hex[65])
{
	unsigned char md[32];
	unsigned int len = 0;
	CAP_BUG_ON(EVP_DigestFinal_ex(h->owned_ctx, md, &len) != 1 || len != 32);
	EVP_MD_CTX_free(h->owned_ctx);
	h->owned_ctx = NULL;
	for (int i = 0; i < 32; i++)
		snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

int cap_sha256_update_fd(struct cap_sha256 *h, int fd, uint64_t *size)
{
	char buf[65536];
	for (;;) {
		ssize_t n = read(fd, buf, sizeof(buf));
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return 0;
		cap_sha256_update(h, buf, (size_t)n);
		if (size)
			*size += (uint64_t)n;
	}
}

int cap_sha256_update_file(struct cap_sha256 *h, const char *path)
{
	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	return cap_sha256_update_fd(h, fd, NULL);
}
