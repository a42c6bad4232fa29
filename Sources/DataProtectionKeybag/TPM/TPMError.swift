import CTPMSoftwareStack

/// A TPM command, or the TPM Software Stack under it, failed: which call, the response code and
/// the stack's text for it (`Tss2_RC_Decode`).
package struct TPMError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What the failure means for the caller.
    package enum Kind: Sendable, Equatable {
        /// The TPM Software Stack's libraries cannot be loaded: no TPM operation can run here.
        case softwareStackMissing
        /// No TPM answered (no device, no simulator on the configured socket, a TCTI that does not load).
        case unreachable
        /// The authorization value was wrong: the TPM counted a dictionary-attack failure.
        case authorizationFailed
        /// The TPM is in dictionary-attack lockout: it refuses every DA-protected object for now.
        case lockout
        /// A policy did not hold (the PCRs the object is bound to changed).
        case policyFailed
        /// The object or index at a handle does not exist (erased, or another TPM).
        case missing
        /// The TPM's non-volatile memory is full.
        case noSpace
        /// Anything else.
        case other
    }

    package let kind: Kind
    /// The ESAPI or TCTI call that failed (`Esys_Unseal` …).
    package let call: String
    /// Its `TSS2_RC`.
    package let code: UInt32

    /// Our own words, for a failure found before the stack was called.
    package var reason: String? = nil

    package init(kind: Kind, call: String, code: UInt32, reason: String? = nil) {
        self.kind = kind
        self.call = call
        self.code = code
        self.reason = reason
    }

    /// Classifies `code`, a response of `call`.
    package init(call: String, code: TSS2_RC) {
        self.init(kind: Self.classify(code), call: call, code: code)
    }

    /// The stack's own words for the code.
    package var detail: String {
        if let reason { return reason }
        guard TPMSoftwareStack.isAvailable, let text = Tss2_RC_Decode(code) else {
            return "0x" + String(code, radix: 16)
        }
        return String(cString: text)
    }

    package var description: String { "\(call) failed: \(detail) (0x\(String(code, radix: 16)))" }

    /// TPM 2.0 Part 2 §6.6: format-one codes carry a handle/session/parameter number in bits 6 and
    /// 8–11; the layer (bits 16–23) is 0 for codes the TPM itself returned.
    static func classify(_ code: TSS2_RC) -> Kind {
        let layer = code & 0xFF_0000
        if layer == 0x0A_0000 { return .unreachable }   // TSS2_TCTI_RC_LAYER (10 << 16)
        guard layer == 0 else { return .other }
        if code & 0x80 != 0 {   // format one
            switch code & 0x3F {
            case 0x0E: return .authorizationFailed   // TPM_RC_AUTH_FAIL
            case 0x1D: return .policyFailed   // TPM_RC_POLICY_FAIL
            case 0x0B: return .missing   // TPM_RC_HANDLE
            default: return .other
            }
        }
        switch code & 0xFFF {
        case 0x921: return .lockout   // TPM_RC_LOCKOUT
        case 0x14B: return .noSpace   // TPM_RC_NV_SPACE
        case 0x902: return .noSpace   // TPM_RC_OBJECT_MEMORY
        case 0x14C: return .noSpace   // TPM_RC_NV_DEFINED (a handle taken meanwhile)
        case 0x18B, 0x28B: return .missing
        default: return .other
        }
    }
}
