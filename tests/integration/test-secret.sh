#!/bin/sh
# Secrets that never enter the VM (issue 15, docs/network.md "Secrets"),
# black-box through the CLI, in a fake internet like the network suite's
# (DESIGN §9: no packet beyond loopback and the namespaces made here):
#
#   INET   tests/net/fakenet.py's servers (scripts/fake-internet.sh builds
#          the namespaces), with HTTPS APIs that record every request
#          whole and keep connections open: api.test (203.0.113.20),
#          else.test (.21), plain.test (.23), certificates from a test CA
#          made now with openssl, which capsule trusts through
#          CAPSULE_CA_FILE; untrusted.test (.22), signed by another CA.
#   CAPNS  capsule's place: a veth to INET only, the fake DNS as resolver,
#          reached through a holder process as in the network suite.
#
# The python image is built first, outside the namespaces (debootstrap
# needs the Debian mirror); its HTTPS client (tests/net/guest-https.py)
# verifies certificates with ssl.create_default_context(), so a request
# that succeeds proves the sandbox's CA is installed. VMs: four
# `capsule run` (base image) and one named python sandbox, restarted once.
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
tests=$(cd "$(dirname "$0")/.." && pwd)
top=$(cd "$tests/.." && pwd)
. "$(dirname "$0")/lib.sh"
# A template's RAM holder outlives its VMs by this long (it is ours too:
# the last check waits for it to end).
export CAPSULE_RAM_HOLDER_IDLE_S=1
. "$top/scripts/fake-internet.sh"
client="$tests/net/guest-https.py"

plan=53
suite="secrets suite"
net_suite_start ip nsenter unshare openssl

fakenet_suite cs
certs="$rt/certs"

# The secrets' values: random, so that finding one anywhere means a leak.
rnd() { od -An -tx1 -N"$1" /dev/urandom | tr -d ' \n'; }
TOKEN="tok-$(rnd 16)"
BODYTOK="bdy-$(rnd 16)"
BADTOK="bad-$(rnd 16)"
printf 'oth-%s\n' "$(rnd 16)" >"$rt/other"
OTHER=$(cat "$rt/other")
OTHER1=$OTHER
export TOKEN BODYTOK BADTOK
export CAPSULE_CA_FILE="$certs/ca.pem"

lines() { cat "$1" 2>/dev/null | wc -l; }
# api LOG FROM: the JSON requests a fake API logged after line FROM, one a line
api() { tail -n +$(($2 + 1)) "$logs/https-$1.log" 2>/dev/null; }
# req NAME FROM PYEXPR: PYEXPR over each request r logged since FROM, one line each
req() {
	api "$1" "$2" | $py -c 'import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if r["event"] != "request":
        continue
    h = {}
    for k, v in r["headers"]:
        h.setdefault(k.lower(), []).append(v)
    print(eval(sys.argv[1]))' "$3"
}
# has_value FILE: any secret's value in FILE
has_value() { grep -qF -e "$TOKEN" -e "$BODYTOK" -e "$BADTOK" -e "$OTHER1" -e "$OTHER" "$1"; }
# has_piece FILE: the first 12 bytes of TOKEN's value in FILE (a quote cut short)
has_piece() { grep -qF -e "$(printf %.12s "$TOKEN")" "$1"; }

# --- images, outside the fake internet -------------------------------------
"$capsule" image build base >"$out" 2>"$err"
check "image build base" 'grep -q "^built base" "$out"'
t0=$(date +%s)
# The sandbox suite's python image when tests/run.sh shares it (verified
# at every start like any image), else one built here.
if [ -d "${CAPSULE_TEST_SHARE:-}/images/names" ] && [ -e "$CAPSULE_TEST_SHARE/images/names/python" ] &&
	cp -a "$CAPSULE_TEST_SHARE/images/." "$CAPSULE_HOME/images/" && "$capsule" image inspect python >"$out" 2>"$err"; then
	how="the sandbox suite's, shared"
	rc=0
else
	"$capsule" image build python >"$out" 2>"$err"
	rc=$?
	how="debootstrap from the Debian mirror"
fi
check "image python ($(($(date +%s) - t0)) s; $how, before the fake internet)" '[ "$rc" -eq 0 ]'
elapsed "images built"

# --- the fake internet and its HTTPS APIs ----------------------------------
setup() {
	$py "$fake" certs "$certs" || return 1
	fake_internet_up "$inet" "$capns" 203.0.113.10 203.0.113.11 203.0.113.20 203.0.113.21 \
		203.0.113.22 203.0.113.23 203.0.113.53 203.0.113.99 198.51.100.7 10.1.2.3 169.254.169.254 || return 1
	fakenet_serve "$inet" "$capns" "$logs" "$certs"
}
if ! setup >"$out" 2>"$err"; then
	not_ok "the fake internet is set up" "namespaces, certificates or the servers failed"
	fail_all "the fake internet could not be set up (see above)"
fi
ok "the fake internet is set up ($inet, $capns)"
a0=$(lines "$logs/https-api.test.log")
cn "$py" "$client" --direct --cafile "$certs/ca.pem" api.test \
	'GET /one HTTP/1.1\r\nHost: api.test\r\n\r\n' 'GET /two HTTP/1.1\r\nHost: api.test\r\n\r\n' >"$out" 2>"$err"
cn "$py" "$client" --direct --cafile "$certs/ca.pem" untrusted.test 'GET / HTTP/1.1\r\nHost: untrusted.test\r\n\r\n' >>"$out" 2>>"$err"
check "fake API: verified with the test CA, keeps the connection (two requests on one), records them; untrusted.test fails that CA" \
	'grep -q "^issuer: capsule test CA" "$out" && grep -q "hello from api.test /two conn [0-9]* seq 2" "$out" && [ "$(req api.test "$a0" "r[\"line\"]")" = "$(printf "GET /one HTTP/1.1\nGET /two HTTP/1.1")" ] && grep -q "^tls failed: .*CERTIFICATE_VERIFY_FAILED" "$out"'
elapsed "the fake internet checked"

# --- capsule run (base image) ----------------------------------------------
c run --secret TOKEN=env:TOKEN@api.test -- sh -c 'echo $TOKEN' >"$out" 2>"$err"
rc=$?
ph_run=$(cat "$out")
check "run --secret TOKEN=env:TOKEN@api.test -- sh -c 'echo \$TOKEN' prints a placeholder ($ph_run), not the value (exit $rc)" \
	'[ "$rc" -eq 0 ] && grep -qx "capsule-ph-[0-9a-f]\{40\}" "$out" && ! has_value "$out" && ! has_value "$err"'

c run --secret TOKEN=env:TOKEN@api.test -- sh -c 'echo "ph=$TOKEN"; env; echo "cmdline=$(cat /proc/cmdline)"; for f in /proc/[0-9]*/environ; do tr "\0" "\n" <$f 2>/dev/null; done; ls /etc/ssl/certs/capsule-ca.pem /etc/ssl/capsule-bundle.pem' >"$out" 2>"$err"
check "run: the CA files and SSL_CERT_FILE, REQUESTS_CA_BUNDLE, GIT_SSL_CAINFO, NODE_EXTRA_CA_CERTS in the command's environment" \
	'grep -qx "SSL_CERT_FILE=/etc/ssl/capsule-bundle.pem" "$out" && grep -qx "REQUESTS_CA_BUNDLE=/etc/ssl/capsule-bundle.pem" "$out" && grep -qx "GIT_SSL_CAINFO=/etc/ssl/capsule-bundle.pem" "$out" && grep -qx "NODE_EXTRA_CA_CERTS=/etc/ssl/certs/capsule-ca.pem" "$out" && grep -qx /etc/ssl/certs/capsule-ca.pem "$out"'
check "run: a new placeholder per sandbox; the value in neither the environment, /proc/*/environ nor the kernel command line" \
	'grep -q "^ph=capsule-ph-" "$out" && ! grep -qx "ph=$ph_run" "$out" && grep -q "^cmdline=." "$out" && ! has_value "$out" && ! has_value "$err"'

# The base image's only HTTPS client, busybox wget, has a TLS of its own
# that verifies nothing and signs with SHA-1 only, which the policy
# process's guest side accepts (netd-tls.c): a one-shot run's request
# carries the value too (its CA in memory), directly and through the
# proxy, and its verbose log names the secret, not the value. The python
# sandbox below makes the requests that verify certificates.
a0=$(lines "$logs/https-api.test.log")
c run -v --secret TOKEN=env:TOKEN@api.test -- sh -c \
	'wget -Y off -q -O- --header "Authorization: Bearer $TOKEN" https://api.test/run; echo "wget=$?"' >"$out" 2>"$err"
check "run -v: a TLS connection to api.test is intercepted, allowed by the secret (named), and nothing printed holds the value" \
	'grep -q "^capsule net: allowed tcp 203.0.113.20:443 (api.test) by --secret TOKEN" "$err" && grep -q "^capsule net: intercepting tls api.test:443" "$err" && ! has_value "$err" && ! has_value "$out"'
check "run: busybox wget https://api.test/run (direct) is answered, and api.test received the real value" \
	'grep -q "^hello from api.test /run " "$out" && grep -qx "wget=0" "$out" && [ "$(req api.test "$a0" "h.get(\"authorization\")")" = "$(printf "%s" "['"'"'Bearer $TOKEN'"'"']")" ]'
# A template that cannot be restored falls back to a cold boot, whose
# policy process needs the values again: the owner keeps them until the
# VM runs (a restore's policy process, forked first, is gone by then).
for t in "$CAPSULE_HOME"/templates/*/state; do printf 'not a migration stream' >"$t"; done
a0=$(lines "$logs/https-api.test.log")
c run -v --secret TOKEN=env:TOKEN@api.test -- sh -c \
	'wget -Y off -q -O- --header "Authorization: Bearer $TOKEN" https://api.test/cold; echo "wget=$?"' >"$out" 2>"$err"
check "run after a failed template restore (cold boot): the secret still works, api.test received the real value" \
	'grep -q "cold boot (template .* unusable" "$err" && grep -q "^hello from api.test /cold " "$out" && [ "$(req api.test "$a0" "h.get(\"authorization\")")" = "$(printf "%s" "['"'"'Bearer $TOKEN'"'"']")" ] && ! has_value "$err"'

# Through the proxy, busybox wget asks for the https:// URL in the clear
# instead of CONNECT: refused (nothing sent anywhere), saying what to do.
a0=$(lines "$logs/https-api.test.log")
c run --secret TOKEN=env:TOKEN@api.test -- sh -c \
	'wget -q -O- --header "Authorization: Bearer $TOKEN" https://api.test/run-proxy; echo "wget=$?"' >"$out" 2>"$err"
check "run: busybox wget's https:// request in the clear to the proxy is refused, saying to use CONNECT or -Y off; api.test got nothing" \
	'grep -qx "wget=1" "$out" && grep -q "refused proxy GET \"https://api.test/run-proxy\": an https:// URL asked of the proxy in the clear: the client must use CONNECT (busybox wget does not: give it -Y off" "$err" && [ "$(lines "$logs/https-api.test.log")" -eq "$a0" ] && ! has_value "$out" && ! has_value "$err"'

env -u TOKEN "$(command -v nsenter)" -t "$holder" -m -n -- "$capsule" run --secret TOKEN=env:TOKEN@api.test -- true >"$out" 2>"$err"
rc=$?
check "run: a secret whose variable is unset fails the start (exit $rc) with a message naming the secret and the variable" \
	'[ "$rc" -ne 0 ] && grep -q "TOKEN" "$err" && grep -q "env:TOKEN\|variable TOKEN\|TOKEN is not set\|TOKEN.*unset\|unset.*TOKEN" "$err"'
elapsed "the runs done"

# --- a named python sandbox --------------------------------------------------
sb=sec
sandboxes=$sb
dir="$CAPSULE_HOME/sandboxes/$sb"
netlog="$dir/net.log"
g() { c exec --timeout 90 "$sb" -- sh -c "$1" >"$out" 2>"$err"; }
# h ARGS...: guest-https.py in the guest; its arguments are evaluated by the
# guest's shell (so "$TOKEN" there is the placeholder).
h() { g "python3 /tmp/h.py $1"; }
mark() { m=$(lines "$netlog"); }
newlog() { tail -n +$((m + 1)) "$netlog" 2>/dev/null; }
rtv() { $py -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$dir/runtime.json" "$1" 2>/dev/null; }

c create "$sb" --image python --secret TOKEN=env:TOKEN@api.test --secret "OTHER=file:$rt/other@else.test" \
	--secret BODY=env:BODYTOK@api.test:body --secret BAD=env:BADTOK@untrusted.test \
	--allow-egress plain.test:443 >"$out" 2>"$err" && c start "$sb" >>"$out" 2>>"$err"
check "create --image python with four secrets and start" '[ -n "$(rtv qemu_pid)" ] && [ -n "$(rtv netd_pid)" ]'
c exec "$sb" -- sh -c 'cat >/tmp/h.py' <"$client" >/dev/null 2>&1
c exec "$sb" -- sh -c 'cat >/tmp/testca.pem' <"$certs/ca.pem" >/dev/null 2>&1
g 'echo "TOKEN=$TOKEN"; echo "OTHER=$OTHER"; echo "BODY=$BODY"; env | grep "^SSL_CERT_FILE\|^NODE_EXTRA"; cmp /tmp/h.py /dev/null >/dev/null || echo client-copied'
ph=$(sed -n 's/^TOKEN=//p' "$out")
ph_other=$(sed -n 's/^OTHER=//p' "$out")
check "guest: TOKEN, OTHER and BODY are distinct placeholders ($ph)" \
	'echo "$ph" | grep -qx "capsule-ph-[0-9a-f]\{40\}" && echo "$ph_other" | grep -qx "capsule-ph-[0-9a-f]\{40\}" && [ "$ph" != "$ph_other" ] && [ "$(grep -c "=capsule-ph-" "$out")" -eq 3 ] && grep -qx client-copied "$out" && ! has_value "$out"'

a0=$(lines "$logs/https-api.test.log")
h 'api.test "GET /proxy HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer $TOKEN\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\n\r\n"'
check "via the proxy (CONNECT): the guest verifies capsule's certificate for api.test with the default context and gets the answer" \
	'grep -q "^issuer: capsule CA" "$out" && grep -q "^hello from api.test /proxy " "$out"'
check "... api.test received the real value, one Connection: close, no Keep-Alive or Proxy-Connection" \
	'[ "$(req api.test "$a0" "(r[\"line\"], h.get(\"authorization\"), h.get(\"connection\"), h.get(\"keep-alive\"), h.get(\"proxy-connection\"))")" = "$(printf "%s" "('"'"'GET /proxy HTTP/1.1'"'"', ['"'"'Bearer $TOKEN'"'"'], ['"'"'close'"'"'], None, None)")" ]'
check "... and the response the guest got carries exactly one Connection: close" \
	'[ "$(grep -ci "^connection:" "$out")" -eq 1 ] && grep -qix "connection: close" "$out" && ! has_value "$out"'

a0=$(lines "$logs/https-api.test.log")
h '--direct api.test "GET /direct HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer $TOKEN\r\n\r\n"'
check "direct (DNS, SNI): verified, answered, and api.test received the real value" \
	'grep -q "^issuer: capsule CA" "$out" && grep -q "^hello from api.test /direct " "$out" && [ "$(req api.test "$a0" "h.get(\"authorization\")")" = "$(printf "%s" "['"'"'Bearer $TOKEN'"'"']")" ]'

# A fork of it: the child's placeholders are its own (its own CA), and
# its policy process swaps them for the real value.
c fork "$sb" --prefix fs >"$out" 2>"$err"
rc=$?
c exec fs1 -- sh -c 'echo "TOKEN=$TOKEN"' >"$out" 2>"$err"
ph1=$(sed -n 's/^TOKEN=//p' "$out")
check "fork: the child's TOKEN is a placeholder of its own ($ph1, the parent's $ph; exit $rc)" \
	'[ "$rc" -eq 0 ] && echo "$ph1" | grep -qx "capsule-ph-[0-9a-f]\{40\}" && [ "$ph1" != "$ph" ]'
a0=$(lines "$logs/https-api.test.log")
c exec --timeout 90 fs1 -- sh -c 'python3 /tmp/h.py --direct api.test "GET /child HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer $TOKEN\r\n\r\n"' >"$out" 2>"$err"
check "... the child verifies its own capsule CA and api.test receives the real value for its placeholder" \
	'grep -q "^issuer: capsule CA" "$out" && grep -q "^hello from api.test /child " "$out" && [ "$(req api.test "$a0" "h.get(\"authorization\")")" = "$(printf "%s" "['"'"'Bearer $TOKEN'"'"']")" ]'
c rm -f fs1 >/dev/null 2>&1
c snapshot rm "$sb-fork1" >/dev/null 2>&1

e0=$(lines "$logs/https-else.test.log")
h 'else.test "GET /else HTTP/1.1\r\nHost: else.test\r\nAuthorization: Bearer $TOKEN\r\nX-Other: $OTHER\r\n\r\n"'
check "else.test (OTHER's host, intercepted): TOKEN's placeholder arrives unchanged, OTHER's value (from its file) is put in" \
	'grep -q "^hello from else.test /else " "$out" && [ "$(req else.test "$e0" "(h.get(\"authorization\"), h.get(\"x-other\"))")" = "$(printf "%s" "(['"'"'Bearer $ph'"'"'], ['"'"'$OTHER'"'"'])")" ]'
p0=$(lines "$logs/https-plain.test.log")
h '--cafile /tmp/testca.pem plain.test "GET /plain HTTP/1.1\r\nHost: plain.test\r\nAuthorization: Bearer $TOKEN\r\n\r\n"'
check "plain.test (allowed, no secret): passed through untouched (the real server's certificate), the placeholder arrives as is" \
	'grep -q "^issuer: capsule test CA" "$out" && grep -q "^hello from plain.test /plain " "$out" && [ "$(req plain.test "$p0" "h.get(\"authorization\")")" = "['"'"'Bearer $ph'"'"']" ]'

# Keep-alive (seed 003's leak): a second request on the same connection
# must never be judged by the first one's check.
a0=$(lines "$logs/https-api.test.log")
e0=$(lines "$logs/https-else.test.log")
h 'api.test "GET /first HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer $TOKEN\r\n\r\n" "GET /second HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer $TOKEN\r\n\r\n"'
sed 's/^/# guest: /' "$out" | grep -v "^# guest: \(Date\|Server\|Content-Type\):"
check "keep-alive: the first response carries Connection: close, and no second response comes on that connection" \
	'grep -q "^hello from api.test /first " "$out" && [ "$(grep -ci "^connection: close" "$out")" -eq "$(grep -c "^--- response" "$out")" ] && ! grep -q "/second" "$out"'
check "keep-alive: the server got /first with the value and each request on its own connection; /second never with the value" \
	'[ "$(req api.test "$a0" "(r[\"line\"], r[\"seq\"])" | head -1)" = "('"'"'GET /first HTTP/1.1'"'"', 1)" ] && [ "$(req api.test "$a0" "r[\"seq\"]" | sort -u)" = 1 ] && ! req api.test "$a0" "r[\"line\"] + str(h.get(\"authorization\"))" | grep -q "/second.*$TOKEN"'
h 'api.test "GET /first HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer $TOKEN\r\n\r\n" "GET /to-else HTTP/1.1\r\nHost: else.test\r\nAuthorization: Bearer $TOKEN\r\n\r\n"'
h '--pipeline api.test "GET /first HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer $TOKEN\r\n\r\nGET /piped HTTP/1.1\r\nHost: else.test\r\nAuthorization: Bearer $TOKEN\r\n\r\n"'
check "keep-alive to another Host and pipelined: only /first ever arrives, on its own connection; nothing reaches else.test" \
	'! req api.test "$a0" "r[\"line\"]" | grep -qv "^GET /first " && [ "$(req api.test "$a0" "r[\"seq\"]" | sort -u)" = 1 ] && [ "$(lines "$logs/https-else.test.log")" -eq "$e0" ] && ! grep -q "/to-else\|/piped" "$out"'

# Echoes: the value comes back in the body, whole or split across chunks.
a0=$(lines "$logs/https-api.test.log")
mark
h 'api.test "GET /echo HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer $TOKEN\r\n\r\n"'
cp "$out" "$rt/echo1"
h 'api.test "GET /echo-chunked HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer $TOKEN\r\n\r\n"'
check "echo: the API echoed the real value; the guest got the placeholder (whole body, and split across chunks)" \
	'[ "$(req api.test "$a0" "h.get(\"authorization\")" | sort -u)" = "['"'"'Bearer $TOKEN'"'"']" ] && grep -qx "auth=Bearer $ph" "$rt/echo1" && grep -qx "auth=Bearer $ph" "$out" && ! has_value "$out" && ! has_value "$rt/echo1"'
check "echo: net.log says TOKEN's value was replaced in the response" \
	'wait_for "newlog | grep -q \"held secret TOKEN.s value\"" 30'

# The body option: BODY's placeholder in a JSON body, Content-Length fixed;
# TOKEN (without :body) stays a placeholder there.
a0=$(lines "$logs/https-api.test.log")
g 'body="{\"token\": \"$BODY\", \"other\": \"$TOKEN\"}"; python3 /tmp/h.py api.test "POST /body HTTP/1.1\r\nHost: api.test\r\nContent-Type: application/json\r\nContent-Length: ${#body}\r\n\r\n$body"
   a=$(printf %s "$BODY" | cut -c1-20); b=$(printf %s "$BODY" | cut -c21-)
   c1="{\"token\": \"$a"; c2="$b\"}"
   python3 /tmp/h.py api.test "POST /chunked HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n$(printf %x ${#c1})\r\n$c1\r\n$(printf %x ${#c2})\r\n$c2\r\n0\r\n\r\n"'
check "body: BODY's value in the JSON body, Content-Length matching, TOKEN's placeholder left there as is" \
	'[ "$(req api.test "$a0" "(r[\"line\"], r[\"body\"], h.get(\"content-length\"), [str(len(r[\"body\"]))])" | head -1)" = "$(printf "%s" "('"'"'POST /body HTTP/1.1'"'"', '"'"'{\"token\": \"$BODYTOK\", \"other\": \"$ph\"}'"'"', ['"'"'$((${#BODYTOK} + ${#ph} + 26))'"'"'], ['"'"'$((${#BODYTOK} + ${#ph} + 26))'"'"'])")" ]'
check "body: a chunked body with BODY's placeholder split across chunks arrives de-chunked, with the value and a Content-Length" \
	'[ "$(req api.test "$a0" "(r[\"line\"], r[\"body\"], h.get(\"content-length\"), h.get(\"transfer-encoding\"))" | sed -n 2p)" = "$(printf "%s" "('"'"'POST /chunked HTTP/1.1'"'"', '"'"'{\"token\": \"$BODYTOK\"}'"'"', ['"'"'$((${#BODYTOK} + 13))'"'"'], None)")" ]'

# An upstream whose certificate capsule does not trust.
u0=$(lines "$logs/https-untrusted.test.log")
mark
h 'untrusted.test "GET /u HTTP/1.1\r\nHost: untrusted.test\r\nAuthorization: Bearer $BAD\r\n\r\n"'
check "untrusted.test: the guest's request fails, the server never gets a request" \
	'! grep -q "^--- response" "$out" && [ "$(req untrusted.test "$u0" "r[\"line\"]" | wc -l)" -eq 0 ]'
check "... and net.log says the certificate is not trusted" \
	'wait_for "newlog | grep -q \"refused tls untrusted.test:443: the server.s certificate is not trusted\"" 30'

# Control characters in a CONNECT target or an SNI naming the secret's host.
a0=$(lines "$logs/https-api.test.log")
mark
h 'raw 10.0.2.2 3128 "CONNECT api.test\r\nX: y:443 HTTP/1.1\r\nHost: api.test:443\r\n\r\n"'
cp "$out" "$rt/raw1"
h 'raw 10.0.2.2 3128 "CONNECT api.test\x01:443 HTTP/1.1\r\n\r\n"'
check "CONNECT api.test with CR/LF or a control character in the target: 400, logged, api.test got nothing" \
	'head -1 "$rt/raw1" | grep -q "^HTTP/1.[01] 400" && head -1 "$out" | grep -q "^HTTP/1.[01] 400" && wait_for "newlog | grep -q \"refused proxy\"" 30 && [ "$(lines "$logs/https-api.test.log")" -eq "$a0" ]'
# A connection to api.test's address is allowed only while the guest's
# resolution of the name is remembered (its TTL, 60 s here): the last one,
# --direct above, may be older than that on a loaded machine.
g 'python3 -c "import socket; print(socket.gethostbyname(\"api.test\"))"'
mark
h "raw 203.0.113.20 443 '$($py "$fake" clienthello 'api.test\r\nx')'"
h2=$(cat "$out")
h "raw 203.0.113.20 443 '$($py "$fake" clienthello 'api.test\001')'"
sleep 1
newlog | grep "refused" | sed 's/^/# net.log: /'
echo "$h2" | sed 's/^/# first: /'
api api.test "$a0" | sed 's/^/# api.test: /'
# (The policy process dials an address it allows before it reads the
# ClientHello, so api.test may see a connection: never a byte of it.)
check "an SNI of api.test with CR/LF or a control character: closed, logged, api.test got not a byte" \
	'echo "$h2" | grep -q "^--- closed\|^--- error" && grep -q "^--- closed\|^--- error" "$out" && wait_for "[ \$(newlog | grep -c \"TLS server name .*control characters\") -ge 2 ]" 30 && [ -z "$(api api.test "$a0" | $py -c "import json, sys; [print(l) for l in sys.stdin if json.loads(l).get(\"first\", \"x\")]")" ]'

# A server that reflects the request's Authorization (the real value, once
# swapped) into its Content-Encoding: refused as encoded, and the refusal's
# text, to the guest and in net.log, quotes none of it (issue 30). After
# the SNI checks, which need api.test's address resolved within its TTL.
mark
h 'api.test "GET /reflect-encoding HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer $TOKEN\r\n\r\n"'
check "reflect: the server's Content-Encoding held the value; the guest got a 502 saying so, without the value or its start" \
	'grep -q "^HTTP/1.1 502 " "$out" && grep -q "encoded its response (Content-Encoding: one not registered, not quoted)" "$out" && ! has_value "$out" && ! has_piece "$out"'
wait_for "newlog | grep -q \"refused the response to https api.test:443 GET \\\"/reflect-encoding\\\"\"" 30
newlog >"$rt/reflect.log"
sed 's/^/# net.log: /' "$rt/reflect.log"
check "reflect: net.log says why the response was refused, and holds no value, nor its start" \
	'grep -q "refused the response to https api.test:443 GET \"/reflect-encoding\": the server encoded its response" "$rt/reflect.log" && ! has_value "$rt/reflect.log" && ! has_piece "$rt/reflect.log"'

# Nothing of the values inside, after the echoes: the guest's environ, RAM
# (read from the host, QEMU's guest RAM mapping), disks, and the host's
# state and logs.
g 'echo "$TOKEN" >/work/ph-marker; sync; for f in /proc/[0-9]*/environ; do tr "\0" "\n" <$f 2>/dev/null; done'
check "guest: the placeholder in its processes' environ, no value" 'grep -qx "TOKEN=$ph" "$out" && ! has_value "$out"'
qpid=$(rtv qemu_pid)
$py "$fake" scan-memory "$qpid" 64 "$TOKEN" "$OTHER" "$BODYTOK" "$BADTOK" "$ph" >"$out" 2>"$err"
sed 's/^/# RAM: /' "$out"
check "guest RAM (QEMU $qpid, read from the host): TOKEN's placeholder found, no value of any secret" \
	'grep -q "^needle 5: [1-9]" "$out" && [ "$(grep -c "^needle [1-4]: 0 " "$out")" -eq 4 ]'
$py "$fake" scan-files "$TOKEN" "$OTHER" "$BODYTOK" "$BADTOK" "$ph" -- "$dir" >"$out" 2>"$err"
grep "^needle\|^read" "$out" | sed 's/^/# files: /'
check "the sandbox's directory (disks, record.json, net.log, CA): the placeholder written to /work found, no value" \
	'grep -q "^needle 5: [1-9]" "$out" && [ "$(grep -c "^needle [1-4]: 0 " "$out")" -eq 4 ]'
check "record.json keeps the secrets' declarations, not the values" \
	'grep -q "TOKEN=env:TOKEN@api.test" "$dir/record.json" && grep -q "BODY=env:BODYTOK@api.test:body" "$dir/record.json" && ! has_value "$dir/record.json"'
c inspect "$sb" >"$out" 2>"$err"
c net show "$sb" >>"$out" 2>>"$err"
grep -i "secret\|network" "$out" | sed 's/^/# /'
check "inspect and net show: each secret's name, source and hosts, no value" \
	'[ "$(grep -c "TOKEN=env:TOKEN@api.test" "$out")" -ge 2 ] && grep -q "OTHER=file:$rt/other@else.test" "$out" && grep -q "BAD=env:BADTOK@untrusted.test" "$out" && ! has_value "$out"'

# Restart: the same placeholders, the values read again from their sources.
printf 'oth-%s\n' "$(rnd 16)" >"$rt/other"
OTHER2=$(cat "$rt/other")
c stop "$sb" >/dev/null 2>&1
c start "$sb" >"$out" 2>"$err"
g 'echo "TOKEN=$TOKEN"; echo "OTHER=$OTHER"'
check "restart: the same placeholders" 'grep -qx "TOKEN=$ph" "$out" && grep -qx "OTHER=$ph_other" "$out"'
c exec "$sb" -- sh -c 'test -f /tmp/h.py || cat >/tmp/h.py' <"$client" >/dev/null 2>&1
e0=$(lines "$logs/https-else.test.log")
h 'else.test "GET /restarted HTTP/1.1\r\nHost: else.test\r\nX-Other: $OTHER\r\n\r\n"'
check "restart: OTHER's file was read again (else.test gets the new value)" \
	'[ "$(req else.test "$e0" "h.get(\"x-other\")")" = "['"'"'$OTHER2'"'"']" ]'
OTHER="$OTHER2"

# --- a credential file (--secret-file, docs/coding-agents.md) ------------------
# The host's file as an agent keeps it; its two tokens are values.
CRED_AT="ata-$(rnd 16)"
CRED_RT="rtr-$(rnd 16)"
CRED_AT2="atb-$(rnd 16)"
has_cred() { grep -qF -e "$CRED_AT" -e "$CRED_RT" -e "$CRED_AT2" "$1"; }
cred="$rt/agent/credentials.json"
mkdir -p "$rt/agent"
printf '{"oauth": {"accessToken": "%s", "refreshToken": "%s", "expiresAt": 1000}, "account": "me@example.test"}\n' \
	"$CRED_AT" "$CRED_RT" >"$cred"
sandboxes="$sandboxes cf"
c create cf --image python --secret-file "~/.agent/credentials.json=$cred:oauth.accessToken,oauth.refreshToken@api.test" \
	>"$out" 2>"$err" && c start cf >>"$out" 2>>"$err"
check "create with --secret-file and start" '[ "$?" -eq 0 ] && grep -q "secret-file /work/.agent/credentials.json=$cred:oauth.accessToken,oauth.refreshToken@api.test" "$out"'
c exec cf -- sh -c 'cat >/tmp/h.py' <"$client" >/dev/null 2>&1
gf() { c exec --timeout 90 cf -- sh -c "$1" >"$out" 2>"$err"; }
gf 'stat -c "%a %u" ~/.agent/credentials.json; cat ~/.agent/credentials.json'
cph=$(sed -n 's/.*"accessToken": "\([^"]*\)".*/\1/p' "$out")
crph=$(sed -n 's/.*"refreshToken": "\([^"]*\)".*/\1/p' "$out")
check "the guest's copy (0600, the tool user's) holds placeholders for the two fields and the rest as it was" \
	'grep -qx "600 1000" "$out" && echo "$cph" | grep -qx "capsule-ph-[0-9a-f]\{40\}" && echo "$crph" | grep -qx "capsule-ph-[0-9a-f]\{40\}" && [ "$cph" != "$crph" ] && grep -q "\"expiresAt\": 1000" "$out" && grep -q "\"account\": \"me@example.test\"" "$out" && ! has_cred "$out"'
# The guest reads its token from the file, as an agent does.
AUTH='"GET /cred HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer $(sed -n "s/.*\"accessToken\": \"\([^\"]*\)\".*/\1/p" /work/.agent/credentials.json)\r\n\r\n"'
a0=$(lines "$logs/https-api.test.log")
gf "python3 /tmp/h.py api.test $AUTH"
check "a request with the file's placeholder: api.test received the real access token; the guest never sees it" \
	'grep -q "^hello from api.test /cred " "$out" && [ "$(req api.test "$a0" "h.get(\"authorization\")")" = "['"'"'Bearer $CRED_AT'"'"']" ] && ! has_cred "$out"'
# An OAuth refresh on the host: the file replaced by a rename, as agents
# write it.
printf '{"oauth": {"accessToken": "%s", "refreshToken": "%s", "expiresAt": 2000}, "account": "me@example.test"}\n' \
	"$CRED_AT2" "$CRED_RT" >"$cred.new" && mv "$cred.new" "$cred"
wait_for "c exec cf -- cat /work/.agent/credentials.json 2>/dev/null | grep -q '\"expiresAt\": 2000'" 100
a0=$(lines "$logs/https-api.test.log")
gf "cat ~/.agent/credentials.json; python3 /tmp/h.py api.test $AUTH"
check "a change of the host file reaches the next request without a restart (the new token), and the guest's copy (expiresAt 2000, same placeholders)" \
	'grep -q "^hello from api.test /cred " "$out" && [ "$(req api.test "$a0" "h.get(\"authorization\")")" = "['"'"'Bearer $CRED_AT2'"'"']" ] && grep -q "\"expiresAt\": 2000" "$out" && grep -q "$cph" "$out" && ! has_cred "$out"'
# A refresh by the guest: the refresh token goes in the body, where a
# credential file's values are never put: the token endpoint gets the
# placeholder, so it can mint nothing; and what comes back holds no value.
a0=$(lines "$logs/https-api.test.log")
gf "python3 /tmp/h.py api.test \"POST /oauth/token HTTP/1.1\r\nHost: api.test\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: \$(printf 'grant_type=refresh_token&refresh_token=%s' '$crph' | wc -c)\r\n\r\ngrant_type=refresh_token&refresh_token=$crph\""
check "a guest-side refresh: the token endpoint receives the placeholder, never the refresh token, and the guest gets no real token" \
	'grep -q "^hello from api.test /oauth/token " "$out" && [ "$(req api.test "$a0" "r.get(\"body\", \"\")" | grep -c "$crph")" -ge 1 ] && ! req api.test "$a0" "r.get(\"body\", \"\")" | grep -qF "$CRED_RT" && ! has_cred "$out"'
c create cf2 --secret-file "~/x.json=$rt/agent/none.json@api.test" >/dev/null 2>&1
c start cf2 >"$out" 2>"$err"
rc=$?
sandboxes="$sandboxes cf2"
check "a credential file that is not there fails the start (exit $rc), naming it" \
	'[ "$rc" -ne 0 ] && grep -q "secret-file /work/x.json" "$err" && grep -q "$rt/agent/none.json" "$err"'
c create cf3 --secret-file "~/x.json=$cred:oauth.accessToken@api.test:body" >"$out" 2>"$err"
rc=$?
check "a credential file's values in request bodies is refused at creation, saying why (exit $rc)" \
	'[ "$rc" -eq 2 ] && grep -q "request headers only" "$err"'
c rm -f cf >/dev/null 2>&1
c rm -f cf2 >/dev/null 2>&1

# A named sandbox whose variable is missing at start.
sandboxes="$sandboxes miss"
c create miss --secret GONE=env:CAPSULE_TEST_UNSET_VAR@api.test >/dev/null 2>&1
c start miss >"$out" 2>"$err"
rc=$?
check "a named sandbox whose secret's variable is unset does not start (exit $rc), the message names the secret and the variable" \
	'[ "$rc" -ne 0 ] && grep -q "GONE" "$err" && grep -q "CAPSULE_TEST_UNSET_VAR" "$err"'

# Every file capsule wrote (records, runtime, logs, disks, consoles):
# never a value. The suite's own stdout/stderr of every command were
# checked case by case above.
$py "$fake" scan-files "$TOKEN" "$OTHER1" "$BODYTOK" "$BADTOK" "$OTHER2" "$CRED_AT" "$CRED_RT" "$CRED_AT2" -- "$CAPSULE_HOME" >"$out" 2>"$err"
grep "^needle\|^read" "$out" | sed 's/^/# CAPSULE_HOME: /'
check "nothing under CAPSULE_HOME (net.log, records, logs, disks) holds a value" \
	'grep -q "^read [1-9]" "$out" && [ "$(grep -c "^needle [1-8]: 0 " "$out")" -eq 8 ]'
c net log "$sb" >"$out" 2>"$err"
check "net log names the secrets (by name) and never a value" \
	'grep -q "TOKEN" "$out" && ! has_value "$out"'

c rm -f "$sb" >/dev/null 2>&1
c rm -f miss >/dev/null 2>&1
sandboxes=
wait_for '! ip netns pids "$capns" | xargs -r ps -o args= -p | grep -q "ram-holder"' 100
for p in $(ip netns pids "$capns"); do
	[ "$p" = "$holder" ] || echo "# left in CAPNS: $(ps -o pid=,args= -p "$p")"
done
check "nothing of ours is left running: no QEMU, nothing in CAPNS but the holder" \
	'[ "$(ours)" -eq 0 ] && [ "$(ip netns pids "$capns" | grep -vx "$holder" | wc -l)" -eq 0 ]'
elapsed "all done"
[ "$n" -eq "$plan" ] || echo "# plan says $plan, ran $n"
