package testcert

import (
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"
)

// servesHost checks that a certificate and key pair up and are valid for host now.
func servesHost(t *testing.T, host string, certPEM, keyPEM []byte, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatalf("certificate and key do not pair: %v", err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := cert.VerifyHostname(host); err != nil {
		t.Error(err)
	}
	if now := time.Now(); now.Before(cert.NotBefore) || now.After(cert.NotAfter) {
		t.Errorf("not valid now: %v to %v", cert.NotBefore, cert.NotAfter)
	}
}

func TestECDSA(t *testing.T) {
	certPEM, keyPEM, err := ECDSA("a.test")
	servesHost(t, "a.test", certPEM, keyPEM, err)
}

func TestRSA(t *testing.T) {
	certPEM, keyPEM, err := RSA("b.test", 2048)
	servesHost(t, "b.test", certPEM, keyPEM, err)
}
