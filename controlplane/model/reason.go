package model

// Reason says why part of the cluster is not served as asked: a short CamelCase word
// from the bounded vocabulary below, so it can label metrics and name Events. The
// control plane and nginx each report their own group; a fault both can find (an
// invalid or conflicting path) has one name.
type Reason string

// Reasons of the control plane (translation, allocation, IngressClaims).
const (
	ReasonInvalidAnnotation      Reason = "InvalidAnnotation"
	ReasonInvalidVIP             Reason = "InvalidVIP"
	ReasonVIPConflict            Reason = "VIPConflict"
	ReasonVIPPoolExhausted       Reason = "VIPPoolExhausted"
	ReasonVRIDConflict           Reason = "VRIDConflict"
	ReasonVRIDExhausted          Reason = "VRIDExhausted"
	ReasonGroupNotFound          Reason = "GroupNotFound"
	ReasonNoMatchingGroup        Reason = "NoMatchingGroup"
	ReasonServiceNotFound        Reason = "ServiceNotFound"
	ReasonPortNotFound           Reason = "PortNotFound"
	ReasonUnsupportedBackend     Reason = "UnsupportedBackend"
	ReasonUnsupportedProtocol    Reason = "UnsupportedProtocol"
	ReasonSecretNotFound         Reason = "SecretNotFound"
	ReasonInvalidSecret          Reason = "InvalidSecret"
	ReasonTLSConflict            Reason = "TLSConflict"
	ReasonDefaultBackendConflict Reason = "DefaultBackendConflict"
	ReasonAlreadyBound           Reason = "AlreadyBound"
	ReasonNameTaken              Reason = "NameTaken"
	ReasonPortReserved           Reason = "PortReserved"
	ReasonGroupFull              Reason = "GroupFull"
	ReasonHostTaken              Reason = "HostTaken"
	ReasonGroupNotAllowed        Reason = "GroupNotAllowed"
	ReasonClaimNotAllowed        Reason = "ClaimNotAllowed"
	// ReasonClaimTemplateOverridden: a claim's template asks for an agent
	// setting the operator decides (ServiceAccount, interface, a node label
	// the operator's selector sets otherwise); the operator's is used.
	ReasonClaimTemplateOverridden Reason = "ClaimTemplateOverridden"
	ReasonVIPNotInPool            Reason = "VIPNotInPool"
	ReasonInvalidPool             Reason = "InvalidPool"
)

// Reasons of both: a path nginx cannot match as written, and two sources asking for
// the same path of a host.
const (
	ReasonInvalidPath  Reason = "InvalidPath"
	ReasonPathConflict Reason = "PathConflict"
)

// Reasons of nginx (parts of a snapshot it leaves out of its configuration).
const (
	ReasonInvalidHost      Reason = "InvalidHost"
	ReasonDuplicateHost    Reason = "DuplicateHost"
	ReasonInvalidPathType  Reason = "InvalidPathType"
	ReasonUpstreamNotFound Reason = "UpstreamNotFound"
	ReasonInvalidUpstream  Reason = "InvalidUpstream"
	ReasonInvalidEndpoint  Reason = "InvalidEndpoint"
	// ReasonInvalidRule: a location's conditions or filters that nginx cannot
	// apply as written (a header name that is not a token, a redirect scheme
	// other than http or https).
	ReasonInvalidRule             Reason = "InvalidRule"
	ReasonCertificateNotFound     Reason = "CertificateNotFound"
	ReasonInvalidCertificate      Reason = "InvalidCertificate"
	ReasonCertificateHostMismatch Reason = "CertificateHostMismatch"
	ReasonRedirectWithoutTLS      Reason = "RedirectWithoutTLS"
	ReasonPortConflict            Reason = "PortConflict"
)
