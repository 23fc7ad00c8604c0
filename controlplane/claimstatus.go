package controlplane

import (
	"context"
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/portico-edge/portico/api/v1alpha1"
)

// writeClaimStatus writes st as the claim's status, with the claim's
// generation as observed and its Bound and Ready conditions derived from st
// and reason (one of the v1alpha1.ClaimReason values): a condition whose
// status does not change keeps its lastTransitionTime. Nothing is written when
// the status already is that.
func (c *Controller) writeClaimStatus(ctx context.Context, claim *v1alpha1.IngressClaim, st v1alpha1.IngressClaimStatus, reason string) error {
	st.ObservedGeneration = claim.Generation
	st.Conditions = claimConditions(claim.Status.Conditions, claim.Generation, st, reason)
	if equality.Semantic.DeepEqual(claim.Status, st) {
		return nil
	}
	// A merge patch only removes fields it sets to null: spell every field out.
	fields := map[string]any{"phase": nil, "group": nil, "vips": nil, "boundIngresses": nil, "replicas": nil,
		"readyReplicas": nil, "message": nil, "observedGeneration": nil, "conditions": nil}
	raw, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("encode claim status: %w", err)
	}
	if err := json.Unmarshal(raw, &fields); err != nil {
		return fmt.Errorf("encode claim status: %w", err)
	}
	patch, err := json.Marshal(map[string]any{"status": fields})
	if err != nil {
		return fmt.Errorf("encode claim status: %w", err)
	}
	_, err = c.cfg.Dynamic.Resource(v1alpha1.IngressClaimResource).Namespace(claim.Namespace).Patch(ctx, claim.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	c.countWrite("claim-status", err)
	if err != nil {
		return fmt.Errorf("write claim status: %w", err)
	}
	return nil
}

// claimConditions returns old with the Bound and Ready conditions set for st:
// Bound is True in phase Bound; Ready is True when reason is ClaimReasonBound
// (bound, a VIP, every replica ready). The False ones carry reason and st's
// message.
func claimConditions(old []metav1.Condition, gen int64, st v1alpha1.IngressClaimStatus, reason string) []metav1.Condition {
	conds := make([]metav1.Condition, len(old))
	copy(conds, old)
	bound := metav1.Condition{Type: v1alpha1.ClaimConditionBound, Status: metav1.ConditionFalse, Reason: reason,
		Message: st.Message, ObservedGeneration: gen}
	ready := metav1.Condition{Type: v1alpha1.ClaimConditionReady, Status: metav1.ConditionFalse, Reason: reason,
		Message: st.Message, ObservedGeneration: gen}
	if st.Phase == v1alpha1.ClaimBound {
		bound.Status, bound.Reason = metav1.ConditionTrue, v1alpha1.ClaimReasonBound
		bound.Message = fmt.Sprintf("%d Ingresses bound to group %s", len(st.BoundIngresses), st.Group)
	}
	if reason == v1alpha1.ClaimReasonBound {
		ready.Status = metav1.ConditionTrue
		ready.Message = fmt.Sprintf("%d/%d replicas ready, VIPs %v", st.ReadyReplicas, st.Replicas, st.VIPs)
	}
	apimeta.SetStatusCondition(&conds, bound)
	apimeta.SetStatusCondition(&conds, ready)
	return conds
}
