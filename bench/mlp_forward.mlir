module @m {
  func.func public @main(%w1: tensor<512x512xf32>, %w2: tensor<512x512xf32>, %w3: tensor<512x16xf32>, %x: tensor<64x512xf32>) -> tensor<64x16xf32> {
    %0 = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0] : (tensor<64x512xf32>, tensor<512x512xf32>) -> tensor<64x512xf32>
    %1 = stablehlo.tanh %0 : tensor<64x512xf32>
    %2 = stablehlo.dot_general %1, %w2, contracting_dims = [1] x [0] : (tensor<64x512xf32>, tensor<512x512xf32>) -> tensor<64x512xf32>
    %3 = stablehlo.tanh %2 : tensor<64x512xf32>
    %4 = stablehlo.dot_general %3, %w3, contracting_dims = [1] x [0] : (tensor<64x512xf32>, tensor<512x16xf32>) -> tensor<64x16xf32>
    return %4 : tensor<64x16xf32>
  }
}
