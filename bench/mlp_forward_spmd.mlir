module @spmd attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%w1: tensor<512x512xf32> {mhlo.sharding = "{replicated}"}, %w2: tensor<512x512xf32> {mhlo.sharding = "{replicated}"}, %w3: tensor<512x16xf32> {mhlo.sharding = "{replicated}"}, %x: tensor<64x512xf32> {mhlo.sharding = "{devices=[4,1]0,1,2,3}"}) -> (tensor<64x16xf32> {mhlo.sharding = "{devices=[4,1]0,1,2,3}"}) {
    %0 = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0] : (tensor<64x512xf32>, tensor<512x512xf32>) -> tensor<64x512xf32>
    %1 = stablehlo.tanh %0 : tensor<64x512xf32>
    %2 = stablehlo.dot_general %1, %w2, contracting_dims = [1] x [0] : (tensor<64x512xf32>, tensor<512x512xf32>) -> tensor<64x512xf32>
    %3 = stablehlo.tanh %2 : tensor<64x512xf32>
    %4 = stablehlo.dot_general %3, %w3, contracting_dims = [1] x [0] : (tensor<64x512xf32>, tensor<512x16xf32>) -> tensor<64x16xf32>
    return %4 : tensor<64x16xf32>
  }
}
