package nginx

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"time"
)

// fallbackCertFile is the certificate nginx.conf names for its HTTPS ports, in
// Options.CertDir. nginx does not start a TLS port without one, but no client
// ever gets it: the certificate callback (portico.certificate) replaces it with
// the certificate of the name the client asked for, or refuses the handshake.
const fallbackCertFile = "fallback.pem"

// dictSize is the size of the shared dictionary that holds the table: room for
// 10,000 hosts with their own certificates (about 5 KiB each with the key) and
// their upstreams, with room to spare. Pages nobody writes cost no memory.
const dictSize = "128m"

// writeFallbackCertificate puts a self-signed certificate and its key into dir,
// unless a usable one is there.
func writeFallbackCertificate(dir string) error {
	file := filepath.Join(dir, fallbackCertFile)
	if b, err := os.ReadFile(file); err == nil {
		if _, err := tls.X509KeyPair(b, b); err == nil {
			return nil
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("fallback certificate: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "portico-fallback.invalid"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().AddDate(100, 0, 0),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("fallback certificate: %w", err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("fallback certificate key: %w", err)
	}
	b := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	b = append(b, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})...)
	if err := addCertificates(dir, []CertFile{{Name: fallbackCertFile, PEM: b}}); err != nil {
		return fmt.Errorf("fallback certificate: %w", err)
	}
	return nil
}
