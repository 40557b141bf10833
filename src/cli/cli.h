/* The capsule command line: one file per verb, each a thin layer that
 * parses arguments, calls the library and prints. Only these files print
 * and choose exit codes. */
#ifndef CAP_CLI_H
#define CAP_CLI_H

/* Exit code when capsule itself fails (as docker run and env do). */
#define CAP_EXIT_FAILURE 125

int cap_cli_run(int argc, char **argv);
int cap_cli_doctor(int argc, char **argv);

/* Print "capsule: <msg>" to stderr. */
__attribute__((format(printf, 1, 2))) void cap_cli_error(const char *fmt, ...);

/* Parse a decimal unsigned number in [min, max]; -EINVAL otherwise. */
int cap_cli_parse_uint(const char *s, unsigned long min, unsigned long max,
		       unsigned long *out);

#endif
