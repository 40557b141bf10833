/* Shared inside src/store only. */
#ifndef CAP_STORE_INTERNAL_H
#define CAP_STORE_INTERNAL_H

#include "err.h"

/* busybox --list-full output in a new NUL-terminated string. */
int cap_store_busybox_applets(const char *busybox, char **out,
			      struct cap_err *err);

/* /etc/passwd and /etc/group of the busybox roots (initramfs, base). */
extern const char cap_store_passwd[];
extern const char cap_store_group[];

/* CAPSULE_HOME/images, new string. */
char *cap_store_images_dir(void);

#endif
