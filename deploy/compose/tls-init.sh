#!/bin/sh
# Makes the compose quick start's CA and certificates in $1 once (tls.yaml runs it as the
# one-shot tls-init); an existing ca.crt is kept, and so is everything it signed.
set -eu
dir=$1
cd "$dir"
umask 077
host=${TXMQ_ADVERTISE_HOST:-127.0.0.1}
case "$host" in
  *[!0-9.]*) extra="DNS:$host" ;;
  *) extra="IP:$host" ;;
esac
sans="DNS:localhost,IP:127.0.0.1,$extra"
if [ ! -s ca.crt ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
    -subj /CN=txmq-compose-ca -keyout ca.key -out ca.crt \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
  rm -f server.crt client.crt
fi
issue() {  # name, common name: a certificate for both usages, valid for $sans
  [ -s "$1.crt" ] && return 0
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$2" \
    -keyout "$1.key" -out "$1.csr" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=critical,digitalSignature\n' "$sans" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 825 \
    -extfile "$1.ext" -out "$1.crt" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
issue server txmq-server
issue client txmq-client
# The services run as uid 10001; the client's key is for you (readable on this host: keep
# the directory private on a shared one).
chown 10001:10001 server.key server.crt ca.crt
chmod 0600 server.key ca.key
chmod 0644 ca.crt server.crt client.crt client.key
echo "tls-init: $(openssl x509 -in server.crt -noout -subject) for $sans in $dir"
