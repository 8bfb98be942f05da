"""mindvl.cells: nn.Cell building blocks and the MultimodalModel (never imports data or training code)."""
from .activation import create_activation
from .attention import MultiHeadAttention
from .audio import AudioEncoder
from .eval_nets import EncodeNet, StateAnswerNet, StateGenerateNet
from .export_nets import (AnswerNet, AttachmentNet, AudioEmbedNet, DecodeNet, GenerateNet, ImageEmbedNet,
                          NativePrefillNet, NativeSpeechNet, NativeVisionNet, PrefillNet, TextEmbedNet, ViTVisionNet, VQANet)
from .factory import build_cells, count_cell_parameters
from .fusion import FusionTransformer
from .heads import ContrastiveHead, LogitScale, NormDenseHead
from .masks import MASK_VALUE, padding_mask, prefix_lm_mask, segment_mask
from .multimodal_lm import MultimodalLM
from .multimodal_model import MultimodalModel, TokenInputModel
from .norm import LayerNorm, create_norm
from .quant import Int8Linear
from .text import TextEncoder
from .transformer import TransformerBlock, TransformerStack
from .vision import VisionEncoder, conv_weight_to_matmul

__all__ = [
    "create_activation", "MultiHeadAttention", "AudioEncoder", "AnswerNet", "AudioEmbedNet", "GenerateNet",
    "EncodeNet", "StateAnswerNet", "StateGenerateNet", "AttachmentNet", "PrefillNet", "DecodeNet",
    "NativeVisionNet", "NativePrefillNet", "NativeSpeechNet", "ViTVisionNet",
    "ImageEmbedNet", "TextEmbedNet", "VQANet", "build_cells", "count_cell_parameters", "FusionTransformer", "NormDenseHead", "ContrastiveHead",
    "LogitScale", "MASK_VALUE", "padding_mask", "prefix_lm_mask", "segment_mask",
    "MultimodalModel", "MultimodalLM", "TokenInputModel", "LayerNorm", "create_norm", "Int8Linear", "TextEncoder", "TransformerBlock",
    "TransformerStack",
    "VisionEncoder", "conv_weight_to_matmul",
]
